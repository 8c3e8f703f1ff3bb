/* `kvedge model-synth`, `kvedge prefill` (the cloud role) and `kvedge decode` (the edge role,
 * with the edge-only and cloud-only baselines): clients/e2e/e2e.h from the command line. */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/mview.h"
#include "access/shaper.h"
#include "clients/e2e/adapter.h"
#include "clients/cli/cli.h"
#include "clients/decoder/decoder.h"
#include "clients/decoder/tokenizer.h"
#include "clients/e2e/e2e.h"
#include "clients/lib/kvedge.h"
#include "clients/e2e/prune.h"
#include "clients/decoder/safetensors.h"
#include "access/codec/block.h"
#include "access/codec/error.h"

/* Tokens --max-new generates when not given. */
#define S_MAX_NEW_DEFAULT 16
/* The cloud-only baseline's link when --cloud-link is not given. */
#define S_CLOUD_LINK_DEFAULT "1gbit,10ms"
/* Most bytes of a --context-file read for the BPE tokenizer (the byte tokenizer reads only as
 * many bytes as it may use tokens). */
#define S_CONTEXT_MAX_BYTES (64u << 20)

/* The shapes kvedge_decoder_shape knows: a loaded model that matches one takes its name as
 * the default --model-id. */
static const char *const s_shapes[] = {"opt-125m", "opt-1.3b", "opt-2.7b", "opt-tiny", NULL};

static double s_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---------------------------------------------------------------- shared pieces */

/* What prefill and decode both take: the weights, the model id, the shared context. */
typedef struct {
    const char *cmd; /* "prefill" or "decode", for messages */
    const char *weights;
    const char *model_id;
    const char *ctx_file, *ctx_text, *ctx_ids;
    const char *tokenizer; /* --tokenizer: text goes through this BPE, not the byte tokenizer */
    uint64_t tokens;       /* --tokens: exactly this many context tokens (0 = as given) */
    uint64_t chunk_tokens;
    /* Loaded by s_common_load. */
    kvedge_decoder_t *d;
    kvedge_tokenizer_t *tok; /* NULL without --tokenizer */
    const kvedge_decoder_config_t *cfg;
    kvedge_model_t model;
    int32_t *ctx;
    uint32_t ctx_len;
} s_common_t;

enum {
    S_O_WEIGHTS = 1000,
    S_O_MODEL_ID,
    S_O_CTX_FILE,
    S_O_CTX,
    S_O_CTX_IDS,
    S_O_TOKENS,
    S_O_CHUNK_TOKENS,
    S_O_TOKENIZER,
    /* prefill */
    S_O_SCHEME,
    S_O_DTYPE,
    S_O_GROUP,
    S_O_KEEP,
    S_O_PIN,
    S_O_TTL,
    S_O_LAYERS,
    S_O_MAPPED_ONLY,
    S_O_MASTER,
    S_O_MASTER_PUB,
    S_O_MASTER_KEY,
    /* decode */
    S_O_PROMPT,
    S_O_PROMPT_IDS,
    S_O_MAX_NEW,
    S_O_REPETITION,
    S_O_PLAN_RECOMPUTE,
    S_O_COMPARE,
    S_O_CLOUD_LINK,
    S_O_QUIET,
    S_O_ADAPTER,
    S_O_ACCEPT,
    S_O_BUDGET,
    /* model-synth */
    S_O_SHAPE,
    S_O_OUT,
    S_O_SEED,
    S_O_FP32,
};

#define S_COMMON_OPTS                                                                              \
    {"weights", required_argument, NULL, S_O_WEIGHTS},                                             \
        {"model-id", required_argument, NULL, S_O_MODEL_ID},                                       \
        {"context-file", required_argument, NULL, S_O_CTX_FILE},                                   \
        {"context", required_argument, NULL, S_O_CTX},                                             \
        {"context-ids", required_argument, NULL, S_O_CTX_IDS},                                     \
        {"tokens", required_argument, NULL, S_O_TOKENS},                                           \
        {"chunk-tokens", required_argument, NULL, S_O_CHUNK_TOKENS},                               \
        {"tokenizer", required_argument, NULL, S_O_TOKENIZER},                                     \
    {                                                                                              \
        "help", no_argument, NULL, 'h'                                                             \
    }

#define S_COMMON_HELP                                                                              \
    "  -w, --weights FILE     OPT weights (safetensors, Hugging Face names; `kvedge\n"             \
    "                         model-synth` makes synthetic ones)\n"                                \
    "      --model-id ID      the model's id on the store (default: the shape's name when\n"       \
    "                         the weights have the shape of opt-125m, opt-1.3b, opt-2.7b or\n"     \
    "                         opt-tiny; required otherwise)\n"                                     \
    "      --tokenizer PATH   the BPE tokenizer of --context-file, --context and --prompt\n"       \
    "                         (and of decode's text): a folder with vocab.json + merges.txt or\n"  \
    "                         tokenizer.json, or a tokenizer.json; its ids must fit the model's\n" \
    "                         vocabulary (`kvedge tokenize` shows its ids)\n"                      \
    "      --context-file F   the shared context: the text of F (without --tokenizer, the byte\n"  \
    "                         tokenizer: byte b is token b+4, so the model needs at least 260\n"   \
    "                         token ids)\n"                                                        \
    "      --context TEXT     the shared context as text\n"                                        \
    "      --context-ids L    the shared context as token ids: 5,17,42,...\n"                      \
    "      --tokens N         exactly N context tokens: a longer context is cut to its first\n"    \
    "                         N tokens, a shorter one repeated from its start until it has N\n"    \
    "                         (a small file stands in for a long context)\n"                       \
    "      --chunk-tokens N   context tokens per chunk (default 256); prefill and decode\n"        \
    "                         must agree, as on the model id and the context\n"

/* The long name of option ch in opts, for messages ("?" when none). */
static const char *s_flag(const struct option *opts, int ch)
{
    for (; opts->name; opts++)
        if (opts->val == ch)
            return opts->name;
    return "?";
}

/* Handles one of the options every command of this file shares. Returns 1 when it was one
 * (*bad set when its value is wrong), 0 when it is not. */
static int s_common_opt(s_common_t *c, int ch, const char *arg, bool *bad)
{
    switch (ch) {
    case 'w':
    case S_O_WEIGHTS:
        c->weights = arg;
        return 1;
    case S_O_MODEL_ID:
        c->model_id = arg;
        *bad = !*arg || strlen(arg) > KVEDGE_MODEL_ID_MAX_BYTES;
        return 1;
    case S_O_CTX_FILE:
        c->ctx_file = arg;
        return 1;
    case S_O_CTX:
        c->ctx_text = arg;
        return 1;
    case S_O_CTX_IDS:
        c->ctx_ids = arg;
        return 1;
    case S_O_TOKENS:
        *bad = kvedge_cli_parse_u64(arg, 1, UINT32_MAX, &c->tokens) != 0;
        return 1;
    case S_O_CHUNK_TOKENS:
        *bad = kvedge_cli_parse_u64(arg, 1, KVEDGE_BLOCK_MAX_TOKENS, &c->chunk_tokens) != 0;
        return 1;
    case S_O_TOKENIZER:
        c->tokenizer = arg;
        return 1;
    default:
        return 0;
    }
}

static void s_common_free(s_common_t *c)
{
    kvedge_tokenizer_destroy(&c->tok);
    kvedge_decoder_destroy(&c->d);
    free(c->ctx);
    c->ctx = NULL;
}

/* Comma-separated token ids, each below vocab; at most max of them. Returns an exit code. */
static int s_parse_ids(const char *cmd, const char *flag, const char *s, uint32_t vocab,
                       uint32_t max, int32_t **out, uint32_t *n)
{
    size_t commas = 0;
    for (const char *p = s; *p; p++)
        commas += *p == ',';
    if (commas + 1 > max) {
        kvedge_cli_error("%s: %s has %zu ids; the model takes at most %u positions", cmd, flag,
                         commas + 1, max);
        return KVEDGE_EXIT_USAGE;
    }
    int32_t *ids = calloc(commas + 1, sizeof *ids);
    if (!ids) {
        kvedge_cli_error("%s: out of memory", cmd);
        return KVEDGE_EXIT_FAILURE;
    }
    uint32_t k = 0;
    for (const char *p = s;; k++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char num[16] = "";
        uint64_t v;
        if (len < sizeof num)
            memcpy(num, p, len);
        if (!num[0] || kvedge_cli_parse_u64(num, 0, vocab - 1, &v) != 0) {
            kvedge_cli_error("%s: %s wants token ids 0..%u separated by commas, got '%.*s'", cmd,
                             flag, vocab - 1, (int)len, p);
            free(ids);
            return KVEDGE_EXIT_USAGE;
        }
        ids[k] = (int32_t)v;
        if (!e)
            break;
        p = e + 1;
    }
    *out = ids;
    *n = k + 1;
    return KVEDGE_EXIT_OK;
}

/* Text to token ids with the BPE tokenizer tok (its ids fit the model: s_common_load checked)
 * or, when tok is NULL, with the byte tokenizer, with a clear message when the model's
 * vocabulary cannot hold byte ids. Returns an exit code. */
static int s_text_ids(const char *cmd, const char *flag, kvedge_tokenizer_t *tok, const char *text,
                      size_t len, uint32_t vocab, int32_t **out, uint32_t *n)
{
    if (tok) {
        int32_t *ids = NULL;
        size_t got = 0;
        int rc = kvedge_tokenizer_encode(tok, text, len, &ids, &got);
        if (rc == KVEDGE_OK && got > UINT32_MAX) {
            free(ids);
            rc = KVEDGE_ETOOBIG;
        }
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("%s: cannot tokenize %s: %s", cmd, flag, kvedge_strerror(rc));
            return KVEDGE_EXIT_FAILURE;
        }
        *out = ids;
        *n = (uint32_t)got;
        return KVEDGE_EXIT_OK;
    }
    if (vocab < 256 + KVEDGE_E2E_BYTE_TOKEN_BASE) {
        kvedge_cli_error("%s: the model has %u token ids, too few for the byte tokenizer of %s "
                         "(it needs %d): give token ids instead (--context-ids, --prompt-ids) "
                         "or a tokenizer (--tokenizer)",
                         cmd, vocab, flag, 256 + KVEDGE_E2E_BYTE_TOKEN_BASE);
        return KVEDGE_EXIT_USAGE;
    }
    int32_t *ids = calloc(len ? len : 1, sizeof *ids);
    size_t got = 0;
    int rc = ids ? kvedge_e2e_byte_tokens(text, len, vocab, ids, len, &got) : KVEDGE_ENOMEM;
    if (rc != KVEDGE_OK) {
        free(ids);
        kvedge_cli_error("%s: cannot tokenize %s: %s", cmd, flag, kvedge_strerror(rc));
        return kvedge_cli_exit_code(rc);
    }
    *out = ids;
    *n = (uint32_t)got;
    return KVEDGE_EXIT_OK;
}

/* Reads at most max bytes of path into a new buffer (*len bytes, NUL-terminated); *more says
 * whether the file had more. Returns an exit code. */
static int s_read_file(const char *cmd, const char *path, size_t max, char **out, size_t *len,
                       bool *more)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvedge_cli_error("%s: cannot read the context file %s: %s", cmd, path, strerror(errno));
        return KVEDGE_EXIT_FAILURE;
    }
    char *buf = malloc(max + 1);
    size_t got = buf ? fread(buf, 1, max, f) : 0;
    int c = buf ? fgetc(f) : EOF;
    bool err = !buf || ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        kvedge_cli_error("%s: cannot read the context file %s", cmd, path);
        return KVEDGE_EXIT_FAILURE;
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    *more = c != EOF;
    return KVEDGE_EXIT_OK;
}

/* The context's tokens from the one of --context-file, --context, --context-ids given (checked
 * by the caller), cut or repeated to --tokens when given. Returns an exit code. */
static int s_context(s_common_t *c)
{
    uint32_t cap = c->cfg->max_positions;
    if (c->tokens > cap) {
        kvedge_cli_error("%s: --tokens %llu is over the model's %u positions", c->cmd,
                         (unsigned long long)c->tokens, cap);
        return KVEDGE_EXIT_USAGE;
    }
    /* Read no more than can be used: --tokens, else the model's positions (plus one to say
     * that a context was too long). */
    uint32_t want = c->tokens ? (uint32_t)c->tokens : cap;
    int32_t *ids = NULL;
    uint32_t n = 0;
    int ex;
    if (c->ctx_ids) {
        ex = s_parse_ids(c->cmd, "--context-ids", c->ctx_ids, c->cfg->vocab, UINT32_MAX, &ids, &n);
    } else {
        char *buf = NULL;
        const char *text = c->ctx_text;
        size_t len = text ? strlen(text) : 0;
        bool more = false;
        if (c->ctx_file) {
            ex = s_read_file(c->cmd, c->ctx_file, c->tok ? S_CONTEXT_MAX_BYTES : want, &buf, &len,
                             &more);
            if (ex)
                return ex;
            text = buf;
        }
        if (c->tok) { /* a token is any number of bytes: count tokens, below */
            if (more && !c->tokens) {
                kvedge_cli_error("%s: the context file is over %u bytes: give --tokens N to use "
                                 "the first N tokens of its first %u bytes",
                                 c->cmd, S_CONTEXT_MAX_BYTES, S_CONTEXT_MAX_BYTES);
                free(buf);
                return KVEDGE_EXIT_USAGE;
            }
        } else if (!c->tokens && (more || len > cap)) {
            kvedge_cli_error("%s: the context has more than the model's %u positions: give "
                             "--tokens N to use its first N tokens",
                             c->cmd, cap);
            free(buf);
            return KVEDGE_EXIT_USAGE;
        }
        if (!c->tok && len > want)
            len = want;
        ex = len ? s_text_ids(c->cmd, c->ctx_file ? "--context-file" : "--context", c->tok, text,
                              len, c->cfg->vocab, &ids, &n)
                 : KVEDGE_EXIT_OK;
        free(buf);
    }
    if (ex)
        return ex;
    if (n == 0) {
        free(ids);
        kvedge_cli_error("%s: the context is empty", c->cmd);
        return KVEDGE_EXIT_USAGE;
    }
    if (!c->tokens && n > cap) {
        free(ids);
        kvedge_cli_error("%s: the context has %u tokens, over the model's %u positions: give "
                         "--tokens N to use its first N",
                         c->cmd, n, cap);
        return KVEDGE_EXIT_USAGE;
    }
    if (c->tokens && n != want) {
        int32_t *fit = n < want ? realloc(ids, want * sizeof *ids) : ids;
        if (!fit) {
            free(ids);
            kvedge_cli_error("%s: out of memory", c->cmd);
            return KVEDGE_EXIT_FAILURE;
        }
        for (uint32_t i = n; i < want; i++)
            fit[i] = fit[i % n];
        ids = fit;
        n = want;
    }
    c->ctx = ids;
    c->ctx_len = n;
    return KVEDGE_EXIT_OK;
}

/* The default model id: the name of the known shape the loaded weights have, or NULL. */
static const char *s_shape_name(const kvedge_decoder_config_t *got)
{
    for (int i = 0; s_shapes[i]; i++) {
        kvedge_decoder_config_t s;
        if (kvedge_decoder_shape(s_shapes[i], &s) == KVEDGE_OK && s.layers == got->layers &&
            s.heads == got->heads && s.head_dim == got->head_dim && s.hidden == got->hidden &&
            s.ffn == got->ffn && s.vocab == got->vocab && s.max_positions == got->max_positions)
            return s_shapes[i];
    }
    return NULL;
}

/* Loads --tokenizer (a folder, or a tokenizer.json) and checks that its ids fit the model's
 * embedding rows. Returns an exit code: 2 for a refused file or one that does not fit, 1 when
 * it cannot be read. */
static int s_load_tokenizer(s_common_t *c)
{
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    struct stat st;
    int rc = stat(c->tokenizer, &st) == 0 && S_ISDIR(st.st_mode)
                 ? kvedge_tokenizer_load_dir(c->tokenizer, &c->tok, why, sizeof why)
                 : kvedge_tokenizer_load_json(c->tokenizer, &c->tok, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: cannot load the tokenizer: %s", c->cmd, why);
        return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_USAGE;
    }
    uint32_t need = kvedge_tokenizer_vocab_size(c->tok);
    if (need > c->cfg->vocab) {
        kvedge_cli_error("%s: the tokenizer %s has ids up to %u, but %s has %u embedding rows: "
                         "they do not belong together",
                         c->cmd, c->tokenizer, need - 1, c->weights, c->cfg->vocab);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

/* Loads the weights, settles the model id and its record, and reads the context. Returns an
 * exit code; on failure the caller still calls s_common_free. */
static int s_common_load(s_common_t *c)
{
    if (!c->weights) {
        kvedge_cli_error("%s: --weights FILE is required (OPT safetensors; `kvedge model-synth "
                         "--shape opt-125m --out FILE` makes some)",
                         c->cmd);
        return KVEDGE_EXIT_USAGE;
    }
    int given = !!c->ctx_file + !!c->ctx_text + !!c->ctx_ids;
    if (given != 1) { /* before the weights: a usage error should not wait for a load */
        kvedge_cli_error("%s: give the shared context once: --context-file F, --context TEXT or "
                         "--context-ids LIST",
                         c->cmd);
        return KVEDGE_EXIT_USAGE;
    }
    c->d = kvedge_decoder_new();
    if (!c->d) {
        kvedge_cli_error("%s: out of memory", c->cmd);
        return KVEDGE_EXIT_FAILURE;
    }
    int rc = kvedge_decoder_load(c->d, c->weights, 0);
    if (rc != KVEDGE_OK) {
        const char *why = kvedge_decoder_error(c->d);
        kvedge_cli_error("%s: cannot load the weights %s: %s%s%s", c->cmd, c->weights,
                         kvedge_strerror(rc), why[0] ? ": " : "", why);
        return KVEDGE_EXIT_FAILURE;
    }
    c->cfg = kvedge_decoder_config(c->d);
    if (c->tokenizer) {
        int ex = s_load_tokenizer(c);
        if (ex)
            return ex;
    }
    if (!c->model_id) {
        c->model_id = s_shape_name(c->cfg);
        if (!c->model_id) {
            kvedge_cli_error("%s: %s has no known shape (%u layers, %u heads, hidden %u): give "
                             "--model-id ID",
                             c->cmd, c->weights, c->cfg->layers, c->cfg->heads, c->cfg->hidden);
            return KVEDGE_EXIT_USAGE;
        }
    }
    rc = kvedge_e2e_model(c->d, c->model_id, &c->model);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: model '%s' cannot be stored: %s (%u layers, %u heads of %u)", c->cmd,
                         c->model_id, kvedge_strerror(rc), c->cfg->layers, c->cfg->heads,
                         c->cfg->head_dim);
        return kvedge_cli_exit_code(rc);
    }
    return s_context(c);
}

/* A failed call against a node or proxy, said plainly. Returns the exit code. */
static int s_remote_fail(const s_common_t *c, kvedge_cli_t *cli, int rc)
{
    switch (rc) {
    case KVEDGE_ETIMEDOUT:
        kvedge_cli_error("%s: %s did not answer within the deadline (the node or a source "
                         "behind the proxy is down or too slow: see --deadline)",
                         c->cmd, cli->host);
        break;
    case KVEDGE_ECLOSED:
        kvedge_cli_error("%s: %s went away during the request", c->cmd, cli->host);
        break;
    case KVEDGE_EDENIED:
        kvedge_cli_error("%s: %s refused: this client's key may not do that", c->cmd, cli->host);
        break;
    case KVEDGE_ENOMODEL:
        kvedge_cli_error("%s: %s does not know model '%s': a store node knows the models "
                         "prefilled on it (same --model-id), a proxy the built-in ones (kvedge "
                         "models) and those registered with its master",
                         c->cmd, cli->host, c->model_id);
        break;
    case KVEDGE_ESHAPE:
        kvedge_cli_error("%s: model '%s' on %s has another shape than %s (%u layers, %u heads "
                         "of %u): use another --model-id",
                         c->cmd, c->model_id, cli->host, c->weights, c->cfg->layers, c->cfg->heads,
                         c->cfg->head_dim);
        break;
    case KVEDGE_EFULL:
        kvedge_cli_error("%s: %s is full (everything it holds is pinned)", c->cmd, cli->host);
        break;
    default:
        kvedge_cli_error("%s: %s (%s)", c->cmd, kvedge_strerror(rc), kvedge_errname(rc));
    }
    return kvedge_cli_exit_code(rc) == KVEDGE_EXIT_USAGE ? KVEDGE_EXIT_FAILURE
                                                         : kvedge_cli_exit_code(rc);
}

/* ---------------------------------------------------------------- model-synth */

static const char s_synth_help[] =
    "Writes synthetic OPT weights of a released model's shape: the Hugging Face tensor names\n"
    "and __metadata__, seeded normal weights (std 0.02), fp16 unless --fp32. The text they\n"
    "generate means nothing, but every size and cost is that of the real model, so prefill,\n"
    "decode and the benchmarks run where the real weights are not at hand.\n\n"
    "  -s, --shape NAME   opt-125m, opt-1.3b, opt-2.7b or opt-tiny (the test fixture's shape)\n"
    "  -o, --out FILE     where to write (via a temporary file, renamed)\n"
    "      --seed N       random seed (default 0); the same seed writes the same bytes\n"
    "      --fp32         fp32 tensors (twice the size)\n";

static int s_cmd_synth(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"shape", required_argument, NULL, 's'},
                                         {"out", required_argument, NULL, 'o'},
                                         {"seed", required_argument, NULL, S_O_SEED},
                                         {"fp32", no_argument, NULL, S_O_FP32},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {"model-synth",
                                  NULL,
                                  "--shape NAME --out FILE [--seed N] [--fp32]",
                                  "Write synthetic OPT weights of a named shape.",
                                  NULL,
                                  NULL};
    const char *shape = NULL, *out = NULL;
    uint64_t seed = 0;
    bool fp32 = false;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "s:o:h", opts, NULL)) != -1) {
        if (ch == 's') {
            shape = optarg;
        } else if (ch == 'o') {
            out = optarg;
        } else if (ch == S_O_SEED) {
            if (kvedge_cli_parse_u64(optarg, 0, UINT64_MAX, &seed) != 0) {
                kvedge_cli_error("model-synth: --seed wants a non-negative integer, got '%s'",
                                 optarg);
                return KVEDGE_EXIT_USAGE;
            }
        } else if (ch == S_O_FP32) {
            fp32 = true;
        } else if (ch == 'h') {
            kvedge_cli_usage(stdout, &cmd, s_synth_help);
            return KVEDGE_EXIT_OK;
        } else {
            kvedge_cli_error("model-synth: unknown option or missing value '%s'", argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("model-synth: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    if (!shape || !out) {
        kvedge_cli_error("model-synth: needs --shape NAME and --out FILE");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_decoder_config_t c;
    if (kvedge_decoder_shape(shape, &c) != KVEDGE_OK) {
        kvedge_cli_error("model-synth: unknown shape '%s' (opt-125m, opt-1.3b, opt-2.7b, "
                         "opt-tiny)",
                         shape);
        return KVEDGE_EXIT_USAGE;
    }
    double t0 = s_now_ms();
    errno = 0;
    int rc = kvedge_decoder_synthesize(out, &c, seed, !fp32);
    int err = errno;
    double ms = s_now_ms() - t0;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("model-synth: cannot write %s: %s%s%s", out, kvedge_strerror(rc),
                         rc == KVEDGE_EIO && err ? ": " : "",
                         rc == KVEDGE_EIO && err ? strerror(err) : "");
        return KVEDGE_EXIT_FAILURE;
    }
    /* Count what was written rather than what the shape implies. */
    uint64_t params = 0;
    struct stat st;
    kvedge_safetensors_t *f = kvedge_safetensors_new();
    rc = f ? kvedge_safetensors_open(f, out) : KVEDGE_ENOMEM;
    for (size_t i = 0; rc == KVEDGE_OK && i < kvedge_safetensors_count(f); i++)
        params += kvedge_safetensors_at(f, i)->numel;
    kvedge_safetensors_destroy(&f);
    if (rc != KVEDGE_OK || stat(out, &st) != 0) {
        kvedge_cli_error("model-synth: wrote %s but cannot read it back: %s", out,
                         kvedge_strerror(rc != KVEDGE_OK ? rc : KVEDGE_EIO));
        return KVEDGE_EXIT_FAILURE;
    }
    char b[32];
    if (cli->json) {
        printf("{\"path\":");
        kvedge_cli_json_str(stdout, out);
        printf(",\"shape\":\"%s\",\"layers\":%u,\"heads\":%u,\"hidden\":%u,\"ffn\":%u,"
               "\"vocab\":%u,\"max_positions\":%u,\"parameters\":%llu,\"bytes\":%llu,"
               "\"dtype\":\"%s\",\"seed\":%llu,\"ms\":%.1f}\n",
               shape, c.layers, c.heads, c.hidden, c.ffn, c.vocab, c.max_positions,
               (unsigned long long)params, (unsigned long long)st.st_size, fp32 ? "fp32" : "fp16",
               (unsigned long long)seed, ms);
    } else {
        printf("wrote %s: %s (%u layers, %u heads, hidden %u, ffn %u, vocab %u, %u positions)\n",
               out, shape, c.layers, c.heads, c.hidden, c.ffn, c.vocab, c.max_positions);
        printf("%.2f M parameters, %s %s, seed %llu, in %.1f s\n", (double)params / 1e6,
               kvedge_cli_bytes((uint64_t)st.st_size, b, sizeof b), fp32 ? "fp32" : "fp16",
               (unsigned long long)seed, ms / 1e3);
    }
    return KVEDGE_EXIT_OK;
}

/* ---------------------------------------------------------------- prefill */

static const char s_prefill_help[] =
    "Run as `kvedge -H NODE [--server-key KEY --cert FILE] prefill ...` (-H goes before\n"
    "the command).\n\n"
    "The cloud role: runs the shared context through the model and puts its K/V to the\n"
    "store node at -H, one block per (chunk, layer, head), quantized as asked, under the\n"
    "model id (registered on the node). Edges then decode on top of it with `kvedge -H PROXY\n"
    "decode` given the same weights, model id, context and --chunk-tokens. Prints the chunk\n"
    "chain, the blocks and bytes stored against fp16, and the time of each step.\n\n" S_COMMON_HELP
    "      --scheme S         int8 (default), int4 or lossless\n"
    "      --dtype D          fp16 (default) or fp32: lossless blocks' element type\n"
    "      --group N          int4 group size (default: the codec's)\n"
    "      --keep-channels N  ThinK: key channels kept per head (default all)\n"
    "      --pin              pin the blocks (never evicted)\n"
    "      --ttl S            expire after S seconds (default: the node's)\n"
    "      --layers LIST      prune: put only these layers (0,1,4); the others are computed\n"
    "                         (deeper layers need them) but not stored\n"
    "      --mapped-only      prune: put only the layers that the layer maps registered for\n"
    "                         this model (map/MODEL/EDGE at --master) use, their union;\n"
    "                         refused when no map names the model\n"
    "      --master EP        the Storage Master's ROUTER (with --mapped-only)\n"
    "      --master-pub EP    its PUB (default: for tcp://HOST:PORT, PORT+1)\n"
    "      --master-key KEY   the master's public key or certificate (none: plaintext,\n"
    "                         loopback and ipc only; with the global --cert)\n\n"
    "A request of this model for a layer that was not stored is a miss, which the edge\n"
    "computes; an edge model's MAPPED request asks only for the layers its map names, which\n"
    "--mapped-only keeps. Layers an earlier prefill stored stay (kvedge delete removes them).\n\n"
    "exit codes: 2 usage (also weights of no known shape without --model-id, a --tokenizer\n"
    "refused or whose ids do not fit the model, a bad --layers), 1 weights or a tokenizer\n"
    "that cannot be read or a failed put, 3 --mapped-only with no map naming the model (or\n"
    "maps that use none of its layers), 4 a map that does not fit the model, 5 node or\n"
    "master unreachable.\n";

/* Where --mapped-only reads the maps. */
typedef struct {
    const char *master, *pub, *key, *cert;
    int deadline_ms;
} s_master_t;

/* --mapped-only: the union of the layers the maps naming model m use (kvedge_prune_from_view
 * on a snapshot of map/<m>/). edges receives their edge ids. Returns an exit code. */
static int s_mapped_layers(const s_master_t *ms, const kvedge_model_t *m, kvedge_prune_set_t *keep,
                           size_t *n_maps, char *edges, size_t edges_cap)
{
    char pub[300], prefix[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    if (!ms->pub && kvedge_cli_default_pub(ms->master, pub, sizeof pub) != 0) {
        kvedge_cli_error("prefill: give --master-pub for %s", ms->master);
        return KVEDGE_EXIT_USAGE;
    }
    if (ms->key && !ms->cert) {
        kvedge_cli_error("prefill: --master-key needs --cert (this client's secret certificate)");
        return KVEDGE_EXIT_USAGE;
    }
    if (kvedge_master_key_format(KVEDGE_MASTER_SPACE_MAP, m->id, "x", prefix, sizeof prefix) !=
        KVEDGE_OK) {
        kvedge_cli_error("prefill: '%s' is not a registry model id (1..%u printable bytes, no "
                         "'/'): no map can name it, so --mapped-only cannot be used",
                         m->id, KVEDGE_MASTER_MAX_MODEL_ID_BYTES);
        return KVEDGE_EXIT_USAGE;
    }
    prefix[strlen(prefix) - 1] = '\0'; /* map/<model>/ */
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = ms->master;
    vo.pub = ms->pub ? ms->pub : pub;
    vo.server_key = ms->key;
    vo.client_cert = ms->key ? ms->cert : NULL;
    vo.prefix = prefix;
    vo.start_wait_ms = ms->deadline_ms;
    kvedge_mview_t *v = NULL;
    int rc = kvedge_mview_start(&vo, &v);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("prefill: cannot reach the master: %s%s", kvedge_strerror(rc),
                         rc == KVEDGE_EDENIED ? " (plaintext is for loopback and ipc only: give "
                                                "--master-key and --cert)"
                                              : "");
        return rc == KVEDGE_EINVAL || rc == KVEDGE_EDENIED ? KVEDGE_EXIT_USAGE
                                                           : KVEDGE_EXIT_FAILURE;
    }
    int ex = KVEDGE_EXIT_OK;
    char why[KVEDGE_PRUNE_WHY_BYTES] = "";
    if (kvedge_mview_state(v) != KVEDGE_MVIEW_SYNCED) {
        kvedge_cli_error("prefill: no snapshot from the master at %s within %d ms (master down, "
                         "wrong endpoint, or key not allowed); nothing stored",
                         ms->master, ms->deadline_ms);
        ex = KVEDGE_EXIT_UNAVAILABLE;
    } else if ((rc = kvedge_prune_from_view(v, m->id, m->layers, keep, n_maps, edges, edges_cap,
                                            why, sizeof why)) != KVEDGE_OK) {
        kvedge_cli_error("prefill: --mapped-only: %s; nothing stored", why);
        ex = rc == KVEDGE_ENOTFOUND                         ? KVEDGE_EXIT_NOTFOUND
             : rc == KVEDGE_ECORRUPT || rc == KVEDGE_EPROTO ? KVEDGE_EXIT_CORRUPT
                                                            : KVEDGE_EXIT_FAILURE;
    }
    kvedge_mview_destroy(&v);
    return ex;
}

static int s_cmd_prefill(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {S_COMMON_OPTS,
                                         {"scheme", required_argument, NULL, S_O_SCHEME},
                                         {"dtype", required_argument, NULL, S_O_DTYPE},
                                         {"group", required_argument, NULL, S_O_GROUP},
                                         {"keep-channels", required_argument, NULL, S_O_KEEP},
                                         {"pin", no_argument, NULL, S_O_PIN},
                                         {"ttl", required_argument, NULL, S_O_TTL},
                                         {"layers", required_argument, NULL, S_O_LAYERS},
                                         {"mapped-only", no_argument, NULL, S_O_MAPPED_ONLY},
                                         {"master", required_argument, NULL, S_O_MASTER},
                                         {"master-pub", required_argument, NULL, S_O_MASTER_PUB},
                                         {"master-key", required_argument, NULL, S_O_MASTER_KEY},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {"prefill",
                                  NULL,
                                  "--weights FILE (--context-file F | --context TEXT | "
                                  "--context-ids L) [...]",
                                  "Cloud role: prefill a shared context, put its K/V to a node.",
                                  NULL,
                                  NULL};
    s_common_t c = {.cmd = "prefill"};
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    const char *layers_arg = NULL;
    bool mapped_only = false;
    s_master_t ms = {NULL, NULL, NULL, cli->cert,
                     cli->deadline_ms > 0 ? cli->deadline_ms : KVEDGE_MVIEW_SNAPSHOT_MS};
    char why[KVEDGE_PRUNE_WHY_BYTES] = "";
    uint64_t v;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "w:h", opts, NULL)) != -1) {
        bool bad = false;
        if (s_common_opt(&c, ch, optarg, &bad)) {
        } else if (ch == S_O_LAYERS) {
            /* The syntax now, the range once the weights say how many layers there are. */
            kvedge_prune_set_t syntax;
            layers_arg = optarg;
            bad = kvedge_prune_parse(optarg, KVEDGE_MODEL_MAX_LAYERS, &syntax, why, sizeof why) !=
                      KVEDGE_OK &&
                  !strstr(why, "out of range");
        } else if (ch == S_O_MAPPED_ONLY) {
            mapped_only = true;
        } else if (ch == S_O_MASTER) {
            ms.master = optarg;
        } else if (ch == S_O_MASTER_PUB) {
            ms.pub = optarg;
        } else if (ch == S_O_MASTER_KEY) {
            ms.key = optarg;
        } else if (ch == S_O_SCHEME) {
            bad = kvedge_scheme_parse(optarg, &q.scheme) != KVEDGE_OK;
        } else if (ch == S_O_DTYPE) {
            bad = kvedge_dtype_parse(optarg, &q.dtype) != KVEDGE_OK ||
                  (q.dtype != KVEDGE_DTYPE_FP16 && q.dtype != KVEDGE_DTYPE_FP32);
        } else if (ch == S_O_GROUP) {
            bad = kvedge_cli_parse_u64(optarg, 0, UINT16_MAX, &v) != 0;
            q.group_size = (uint16_t)v;
        } else if (ch == S_O_KEEP) {
            bad = kvedge_cli_parse_u64(optarg, 0, UINT16_MAX, &v) != 0;
            q.keep_channels = (uint16_t)v;
        } else if (ch == S_O_PIN) {
            q.pin = true;
        } else if (ch == S_O_TTL) {
            bad = kvedge_cli_parse_u64(optarg, 1, UINT32_MAX, &v) != 0;
            q.ttl_s = (uint32_t)v;
        } else if (ch == 'h') {
            kvedge_cli_usage(stdout, &cmd, s_prefill_help);
            return KVEDGE_EXIT_OK;
        } else {
            kvedge_cli_error("prefill: unknown option or missing value '%s' (see kvedge prefill "
                             "--help)",
                             argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        if (bad) {
            kvedge_cli_error("prefill: bad value '%s' for --%s%s%s", optarg, s_flag(opts, ch),
                             ch == S_O_SCHEME   ? " (int8, int4 or lossless)"
                             : ch == S_O_DTYPE  ? " (fp16 or fp32)"
                             : ch == S_O_LAYERS ? ": "
                                                : "",
                             ch == S_O_LAYERS ? why : "");
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("prefill: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    if (!cli->host) {
        kvedge_cli_error("prefill: needs -H NODE: the store node to put the context's K/V to");
        return KVEDGE_EXIT_USAGE;
    }
    if (layers_arg && mapped_only) {
        kvedge_cli_error("prefill: give --layers LIST or --mapped-only, not both");
        return KVEDGE_EXIT_USAGE;
    }
    if (mapped_only != (ms.master != NULL) || (!ms.master && (ms.pub || ms.key))) {
        kvedge_cli_error("prefill: --mapped-only needs --master EP (the Storage Master holding "
                         "the layer maps), and --master, --master-pub and --master-key go with "
                         "--mapped-only");
        return KVEDGE_EXIT_USAGE;
    }
    int ex = s_common_load(&c);
    /* Pruning: the set of layers to put, settled before anything is computed or stored. */
    kvedge_prune_set_t keep;
    size_t n_maps = 0;
    char edges[1024] = "";
    if (!ex && layers_arg) {
        if (kvedge_prune_parse(layers_arg, c.cfg->layers, &keep, why, sizeof why) != KVEDGE_OK) {
            kvedge_cli_error("prefill: bad value '%s' for --layers: %s", layers_arg, why);
            ex = KVEDGE_EXIT_USAGE;
        }
    } else if (!ex && mapped_only) {
        ex = s_mapped_layers(&ms, &c.model, &keep, &n_maps, edges, sizeof edges);
    }
    if (!ex && (layers_arg || mapped_only))
        q.layers = &keep;
    kvedge_client_t *node = NULL;
    if (!ex)
        ex = kvedge_cli_connect(cli, "kvedge prefill", &node);
    const kvedge_node_info_t *peer = ex ? NULL : kvedge_client_node(node);
    if (peer && peer->role == KVEDGE_ROLE_PROXY) { /* it would refuse each PUT as invalid */
        kvedge_cli_error("prefill: %s is an edge proxy (%s), not a store node: prefill puts the "
                         "context's K/V to a store node (the cloud node the proxy fetches from)",
                         cli->host, peer->name);
        ex = KVEDGE_EXIT_USAGE;
    }
    uint32_t ct = c.chunk_tokens ? (uint32_t)c.chunk_tokens : KVEDGE_E2E_CHUNK_TOKENS_DEFAULT;
    size_t max = ex ? 0 : (c.ctx_len + ct - 1) / ct, n_ids = 0;
    kvedge_chunk_id_t *ids = ex ? NULL : calloc(max, sizeof *ids);
    kvedge_e2e_prefill_stats_t st = {0};
    if (!ex && !ids) {
        kvedge_cli_error("prefill: out of memory");
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (!ex) {
        int rc = kvedge_e2e_prefill(node, c.d, &c.model, c.ctx, c.ctx_len, ct, &q, ids, max, &st);
        if (rc == KVEDGE_EINVAL) {
            kvedge_cli_error("prefill: the node or codec refused these settings (scheme %s, "
                             "dtype %s, group %u, keep-channels %u of %u): %s",
                             kvedge_scheme_name(q.scheme), kvedge_dtype_name(q.dtype), q.group_size,
                             q.keep_channels, c.cfg->head_dim, kvedge_strerror(rc));
            ex = KVEDGE_EXIT_USAGE;
        } else if (rc != KVEDGE_OK) {
            ex = s_remote_fail(&c, cli, rc);
        }
        n_ids = st.n_chunks ? st.n_chunks : max;
    }
    kvedge_client_destroy(&node);
    if (!ex) {
        char hex[KVEDGE_CHUNK_ID_HEX_BYTES], b1[32], b2[32];
        double ratio = st.bytes ? (double)st.fp16_bytes / (double)st.bytes : 0.0;
        if (cli->json) {
            printf("{\"node\":");
            kvedge_cli_json_str(stdout, cli->host);
            printf(",\"model\":");
            kvedge_cli_json_str(stdout, c.model_id);
            printf(",\"tokens\":%u,\"chunk_tokens\":%u,\"chunks\":[", c.ctx_len, ct);
            for (size_t i = 0; i < n_ids; i++)
                printf("%s\"%s\"", i ? "," : "", kvedge_chunk_id_hex(&ids[i], hex));
            printf("],\"scheme\":\"%s\",\"dtype\":\"%s\",\"blocks\":%llu,\"bytes\":%llu,"
                   "\"fp16_bytes\":%llu,\"prefill_ms\":%.3f,\"encode_ms\":%.3f,"
                   "\"put_ms\":%.3f",
                   kvedge_scheme_name(q.scheme), kvedge_dtype_name(q.dtype),
                   (unsigned long long)st.blocks, (unsigned long long)st.bytes,
                   (unsigned long long)st.fp16_bytes, st.prefill_us / 1e3, st.encode_us / 1e3,
                   st.put_us / 1e3);
            if (q.layers) {
                printf(",\"layers\":[");
                for (uint32_t l = 0, k = 0; l < c.cfg->layers; l++)
                    if (kvedge_prune_set_has(q.layers, l))
                        printf("%s%u", k++ ? "," : "", l);
                printf("],\"pruned_blocks\":%llu,\"pruned_bytes\":%llu,"
                       "\"pruned_fp16_bytes\":%llu",
                       (unsigned long long)st.pruned_blocks, (unsigned long long)st.pruned_bytes,
                       (unsigned long long)st.pruned_fp16_bytes);
                if (mapped_only) {
                    printf(",\"maps\":");
                    kvedge_cli_json_str(stdout, edges);
                }
            }
            printf("}\n");
        } else {
            printf("prefilled %u context tokens of %s (%u layers, %u heads of %u) on %s\n",
                   c.ctx_len, c.model_id, c.cfg->layers, c.cfg->heads, c.cfg->head_dim, cli->host);
            printf("chunks: %zu of %u tokens, first %s\n", n_ids, ct,
                   n_ids ? kvedge_chunk_id_hex(&ids[0], hex) : "-");
            printf("blocks: %llu (%s %s), %s stored for %s fp16: %.2fx%s\n",
                   (unsigned long long)st.blocks, kvedge_scheme_name(q.scheme),
                   kvedge_dtype_name(q.dtype), kvedge_cli_bytes(st.bytes, b1, sizeof b1),
                   kvedge_cli_bytes(st.fp16_bytes, b2, sizeof b2), ratio, q.pin ? ", pinned" : "");
            if (q.layers) {
                char kept[KVEDGE_PRUNE_LIST_BYTES], b3[32];
                kvedge_prune_set_format(q.layers, kept, sizeof kept);
                uint64_t full = st.bytes + st.pruned_bytes;
                printf("layers: kept %s of %u (%s), pruned %u: saved %s of %s (%.1f%%), %llu "
                       "blocks\n",
                       kept, c.cfg->layers, mapped_only ? "mapped" : "--layers",
                       c.cfg->layers - st.layers_put,
                       kvedge_cli_bytes(st.pruned_bytes, b1, sizeof b1),
                       kvedge_cli_bytes(full, b3, sizeof b3),
                       full ? 100.0 * (double)st.pruned_bytes / (double)full : 0.0,
                       (unsigned long long)st.pruned_blocks);
                if (mapped_only)
                    printf("maps: %zu naming %s (edge models %s)\n", n_maps, c.model.id, edges);
            }
            printf("time: prefill %.1f ms, encode %.1f ms, put %.1f ms\n", st.prefill_us / 1e3,
                   st.encode_us / 1e3, st.put_us / 1e3);
        }
    }
    free(ids);
    s_common_free(&c);
    return ex;
}

/* ---------------------------------------------------------------- decode */

static const char s_decode_help[] =
    "Run as `kvedge -H PROXY [--server-key KEY --cert FILE] decode ...` (-H goes before\n"
    "the command).\n\n"
    "The edge role: asks the proxy at -H (or a store node) for the shared context's K/V,\n"
    "one FETCH with the context's chunk ids (computed here from the context), runs each\n"
    "decoder layer as soon as its K/V is resident, computes itself every layer that comes\n"
    "back as a miss, then decodes the prompt on top and generates greedily. The prompt never\n"
    "leaves this process. Prints each layer's source and reason, TTFT, total time and bytes,\n"
    "and the generated token ids and their text: with --tokenizer, the bytes of their tokens;\n"
    "without, as bytes of the byte tokenizer (bytes 32..126 as themselves, others as "
    "'.').\n\n" S_COMMON_HELP
    "      --prompt TEXT      the user's prompt (through --tokenizer, else the byte tokenizer)\n"
    "      --prompt-ids L     the prompt as token ids\n"
    "      --max-new N        tokens to generate (default 16)\n"
    "      --repetition-penalty P  > 1: greedy picks divide the logits of tokens already in\n"
    "                         the prompt or generated by P (CTRL's penalty; default 1: off)\n"
    "      --plan-recompute   send the decoder's time estimates: the proxy may plan layers\n"
    "                         to be computed here rather than fetched\n"
    "      --compare          also run edge-only (recompute everything here) and cloud-only\n"
    "                         (the prompt goes to a cloud model, emulated in this process with\n"
    "                         the context in its prefix cache: its prefill is not timed) and\n"
    "                         print TTFT, time and bytes side by side\n"
    "      --cloud-link SPEC  cloud-only's link, RATE,LATENCY (default " S_CLOUD_LINK_DEFAULT ")\n"
    "  -q, --quiet            print only the generated tokens (and the comparison)\n"
    "      --adapter FILE     large-small (mode ce-lslm, docs/largesmall.md): the FETCH also\n"
    "                         names the cloud model of this adapter (`kvedge layermap\n"
    "                         --adapter FILE` writes one: its cloud id, layers, heads and\n"
    "                         head size) and the context's chunk ids under it; a layer the\n"
    "                         proxy serves from the cloud model (the layer map registered\n"
    "                         for the pair) is adapted here to this model's shape. Needs a\n"
    "                         proxy at -H; the adapter must fit --weights\n"
    "      --accept LIST      the cache optimizer: the precisions this edge accepts, best\n"
    "                         first (lossless, int8, int4-g32/64/128, each +think-75 or\n"
    "                         +think-50; docs/protocol.md \"Precisions\"); the proxy picks one\n"
    "                         per layer, a store node serves the first it holds or derives\n"
    "      --budget M:V       the quality budget the proxy plans under: ppl:PCT (perplexity\n"
    "                         increase, 0 to 100) or kl:NATS (0 to 10), priced with the\n"
    "                         proxy's --quality profiles; needs --accept and a proxy\n\n"
    "--json prints one object: {\"kvedge\": RUN, \"edge_only\": RUN, \"cloud_only\": RUN (with\n"
    "--compare), \"tokens\": {MODE: [ids]}, \"text\": STRING (bytes that are not UTF-8 as\n"
    "U+FFFD), \"tokens_agree\": BOOL, ...}; with --adapter the kvedge RUN's mode is\n"
    "\"ce-lslm\", it names \"mapped_model\" and \"adapted\", and each layer its \"from_layer\"\n"
    "(the cloud layer that fed it, null when its own).\n\n"
    "exit codes: 2 usage (also a --tokenizer refused or whose ids do not fit the model, an\n"
    "--adapter for other shapes than --weights, --adapter against a store node), 1\n"
    "weights that do not load or a decode that failed (a layer failed\n"
    "rather than missed: a source past the deadline, the proxy gone), or an --adapter that\n"
    "cannot be read, 4 an --adapter file refused, 3 the proxy or node does not know the\n"
    "model, 5 proxy unreachable.\n";

/* The generated tokens as text: byte-tokenizer ids of bytes 32..126 as themselves, anything
 * else as '.'. out holds n + 1 chars. */
static void s_render(const int32_t *t, uint32_t n, char *out)
{
    for (uint32_t i = 0; i < n; i++) {
        int32_t b = t[i] - KVEDGE_E2E_BYTE_TOKEN_BASE;
        out[i] = b >= 32 && b <= 126 ? (char)b : '.';
    }
    out[n] = '\0';
}

/* The generated tokens as text, *len bytes and a NUL: with --tokenizer the bytes of their tokens
 * (an id it has no token for, a model row past its vocabulary, as U+FFFD), else s_render's.
 * NULL when out of memory. */
static char *s_gen_text(const s_common_t *c, const int32_t *t, uint32_t n, size_t *len)
{
    char *text = NULL;
    if (!c->tok) {
        text = malloc(n + 1);
        if (text)
            s_render(t, n, text);
        *len = n;
        return text;
    }
    int rc = kvedge_tokenizer_decode(c->tok, t, n, &text, len);
    if (rc != KVEDGE_EINVAL)
        return rc == KVEDGE_OK ? text : NULL;
    /* Some id has no token: one at a time. */
    size_t cap = 16, k = 0;
    text = malloc(cap);
    for (uint32_t i = 0; text && i < n; i++) {
        char *one = NULL;
        size_t ol = 0;
        rc = kvedge_tokenizer_decode(c->tok, &t[i], 1, &one, &ol);
        if (rc == KVEDGE_EINVAL) {
            one = strdup("\xef\xbf\xbd");
            ol = 3;
        }
        char *grown = one && k + ol + 1 > cap ? realloc(text, cap = 2 * (k + ol + 1)) : text;
        if (!one || !grown) {
            free(one);
            free(grown ? grown : text);
            return NULL;
        }
        text = grown;
        memcpy(text + k, one, ol);
        k += ol;
        free(one);
    }
    if (text)
        text[k] = '\0';
    *len = k;
    return text;
}

static void s_print_ids(FILE *f, const int32_t *t, uint32_t n, const char *sep)
{
    for (uint32_t i = 0; i < n; i++)
        fprintf(f, "%s%d", i ? sep : "", t[i]);
}

/* kvedge_e2e_print's JSON object, trailing whitespace trimmed, to embed in ours. */
static void s_print_run_json(const kvedge_e2e_result_t *res)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) {
        printf("null");
        return;
    }
    kvedge_e2e_print(m, res, true);
    fclose(m);
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ' || buf[len - 1] == '\r'))
        len--;
    if (len)
        fwrite(buf, 1, len, stdout);
    else
        printf("null");
    free(buf);
}

/* The first index where the runs' tokens differ, or n when all agree. */
static uint32_t s_agree(int32_t *const tok[], int runs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        for (int r = 1; r < runs; r++)
            if (tok[r][i] != tok[0][i])
                return i;
    return n;
}

static int s_decode_fail(const s_common_t *c, kvedge_cli_t *cli, kvedge_e2e_mode_t mode,
                         uint32_t prompt_len, uint32_t max_new, int rc)
{
    const char *m = kvedge_e2e_mode_name(mode);
    if (rc == KVEDGE_ETOOBIG) {
        kvedge_cli_error("decode: context (%u) + prompt (%u) + --max-new (%u) tokens exceed the "
                         "model's %u positions",
                         c->ctx_len, prompt_len, max_new, c->cfg->max_positions);
        return KVEDGE_EXIT_USAGE;
    }
    if (rc == KVEDGE_ENOMEM) {
        kvedge_cli_error("decode (%s): out of memory", m);
        return KVEDGE_EXIT_FAILURE;
    }
    if (mode != KVEDGE_E2E_KVEDGE) {
        kvedge_cli_error("decode (%s): %s (%s)", m, kvedge_strerror(rc), kvedge_errname(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    return s_remote_fail(c, cli, rc);
}

/* The prompt's tokens from --prompt or --prompt-ids (exactly one given, checked by the
 * caller), at most the model's positions. Returns an exit code. */
static int s_prompt(const s_common_t *c, const char *text, const char *ids, int32_t **out,
                    uint32_t *n)
{
    if (ids)
        return s_parse_ids("decode", "--prompt-ids", ids, c->cfg->vocab, c->cfg->max_positions, out,
                           n);
    size_t len = strlen(text);
    if (len == 0 || (!c->tok && len > c->cfg->max_positions)) {
        kvedge_cli_error("decode: the prompt is %s",
                         len ? "longer than the model's positions" : "empty");
        return KVEDGE_EXIT_USAGE;
    }
    int ex = s_text_ids("decode", "--prompt", c->tok, text, len, c->cfg->vocab, out, n);
    if (!ex && *n > c->cfg->max_positions) {
        kvedge_cli_error("decode: the prompt is %u tokens, longer than the model's %u positions",
                         *n, c->cfg->max_positions);
        free(*out);
        *out = NULL;
        return KVEDGE_EXIT_USAGE;
    }
    return ex;
}

/* --adapter: reads the adapter file, makes the cloud model's record from it (its cloud id,
 * layers, heads, head size; fp16 as kvedge_e2e_model's) and checks it against the loaded
 * edge weights. Returns an exit code. */
static int s_load_adapter(const s_common_t *c, const char *path, kvedge_adapter_t **out,
                          kvedge_model_t *mapped)
{
    char why[512];
    int rc = kvedge_adapter_load(path, out, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("decode: cannot use the adapter %s: %s", path,
                         why[0] ? why : kvedge_strerror(rc));
        return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_CORRUPT;
    }
    const kvedge_adapter_info_t *ai = kvedge_adapter_info(*out);
    memset(mapped, 0, sizeof *mapped);
    size_t idlen = strlen(ai->cloud_id);
    if (idlen == 0 || idlen > KVEDGE_MODEL_ID_MAX_BYTES) {
        kvedge_cli_error("decode: the adapter %s names a cloud model id the store cannot hold",
                         path);
        return KVEDGE_EXIT_USAGE;
    }
    memcpy(mapped->id, ai->cloud_id, idlen + 1);
    mapped->layers = (uint16_t)ai->cloud_layers;
    mapped->kv_heads = (uint16_t)ai->cloud_heads;
    mapped->head_dim = (uint16_t)ai->cloud_head_dim;
    mapped->dtype = KVEDGE_DTYPE_FP16;
    why[0] = '\0';
    if (ai->cloud_layers > KVEDGE_MODEL_MAX_LAYERS || ai->cloud_heads > KVEDGE_MODEL_MAX_HEADS ||
        ai->cloud_head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM || kvedge_model_check(mapped) != KVEDGE_OK)
        rc = KVEDGE_ESHAPE;
    else
        rc = kvedge_adapter_check(*out, NULL, mapped, &c->model, why, sizeof why);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("decode: the adapter %s does not fit %s (%u layers, %u heads of %u)%s%s",
                         path, c->weights, c->cfg->layers, c->cfg->heads, c->cfg->head_dim,
                         why[0] ? ": " : "", why);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

static int s_cmd_decode(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        S_COMMON_OPTS,
        {"prompt", required_argument, NULL, S_O_PROMPT},
        {"prompt-ids", required_argument, NULL, S_O_PROMPT_IDS},
        {"max-new", required_argument, NULL, S_O_MAX_NEW},
        {"repetition-penalty", required_argument, NULL, S_O_REPETITION},
        {"plan-recompute", no_argument, NULL, S_O_PLAN_RECOMPUTE},
        {"compare", no_argument, NULL, S_O_COMPARE},
        {"cloud-link", required_argument, NULL, S_O_CLOUD_LINK},
        {"quiet", no_argument, NULL, 'q'},
        {"adapter", required_argument, NULL, S_O_ADAPTER},
        {"accept", required_argument, NULL, S_O_ACCEPT},
        {"budget", required_argument, NULL, S_O_BUDGET},
        {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {"decode",
                                  NULL,
                                  "--weights FILE (--context-file F | --context TEXT | "
                                  "--context-ids L) (--prompt TEXT | --prompt-ids L) [...]",
                                  "Edge role: decode a prompt on a context's K/V fetched through "
                                  "a proxy.",
                                  NULL,
                                  NULL};
    s_common_t c = {.cmd = "decode"};
    const char *prompt_text = NULL, *prompt_ids = NULL, *cloud_link = S_CLOUD_LINK_DEFAULT;
    const char *adapter_path = NULL;
    uint64_t max_new = S_MAX_NEW_DEFAULT;
    double penalty = 1.0;
    bool plan_recompute = false, compare = false, quiet = false;
    kvedge_prec_t accept[KVEDGE_PREC_MAX_ACCEPT];
    size_t n_accept = 0;
    kvedge_quality_metric_t metric = KVEDGE_QUALITY_NONE;
    double budget = 0;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "w:qh", opts, NULL)) != -1) {
        bool bad = false;
        if (s_common_opt(&c, ch, optarg, &bad)) {
        } else if (ch == S_O_PROMPT) {
            prompt_text = optarg;
        } else if (ch == S_O_PROMPT_IDS) {
            prompt_ids = optarg;
        } else if (ch == S_O_MAX_NEW) {
            bad = kvedge_cli_parse_u64(optarg, 1, UINT32_MAX, &max_new) != 0;
        } else if (ch == S_O_REPETITION) {
            char *end;
            penalty = strtod(optarg, &end);
            bad = *end != '\0' || !(penalty >= 1.0 && penalty <= 10.0);
        } else if (ch == S_O_PLAN_RECOMPUTE) {
            plan_recompute = true;
        } else if (ch == S_O_COMPARE) {
            compare = true;
        } else if (ch == S_O_CLOUD_LINK) {
            uint64_t rate;
            uint32_t lat;
            cloud_link = optarg;
            bad = kvedge_shaper_parse(optarg, &rate, &lat) != KVEDGE_OK;
        } else if (ch == 'q') {
            quiet = true;
        } else if (ch == S_O_ADAPTER) {
            adapter_path = optarg;
        } else if (ch == S_O_ACCEPT) {
            bad = kvedge_prec_list_parse(optarg, accept, KVEDGE_PREC_MAX_ACCEPT, &n_accept) !=
                  KVEDGE_OK;
        } else if (ch == S_O_BUDGET) {
            bad = kvedge_quality_budget_parse(optarg, &metric, &budget) != KVEDGE_OK;
        } else if (ch == 'h') {
            kvedge_cli_usage(stdout, &cmd, s_decode_help);
            return KVEDGE_EXIT_OK;
        } else {
            kvedge_cli_error("decode: unknown option or missing value '%s' (see kvedge decode "
                             "--help)",
                             argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
        if (bad) {
            kvedge_cli_error("decode: bad value '%s' for --%s%s", optarg, s_flag(opts, ch),
                             ch == S_O_CLOUD_LINK ? " (RATE,LATENCY such as 1gbit,10ms)"
                             : ch == S_O_ACCEPT
                                 ? " (1 to 8 distinct precisions, best first, such as "
                                   "int8,int4-g32,int4-g32+think-50)"
                             : ch == S_O_BUDGET ? " (ppl:PCT (0 to 100) or kl:NATS (0 to 10))"
                                                : "");
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("decode: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    if (!cli->host) {
        kvedge_cli_error("decode: needs -H PROXY: the edge proxy (or a store node) to fetch the "
                         "context's K/V from");
        return KVEDGE_EXIT_USAGE;
    }
    if (!prompt_text == !prompt_ids) {
        kvedge_cli_error("decode: give the prompt once: --prompt TEXT or --prompt-ids LIST");
        return KVEDGE_EXIT_USAGE;
    }
    if (metric != KVEDGE_QUALITY_NONE && !n_accept) {
        kvedge_cli_error("decode: --budget needs --accept: the precisions it may choose among");
        return KVEDGE_EXIT_USAGE;
    }
    int ex = s_common_load(&c);
    kvedge_adapter_t *adapter = NULL;
    kvedge_model_t mapped;
    if (!ex && adapter_path)
        ex = s_load_adapter(&c, adapter_path, &adapter, &mapped);
    int32_t *prompt = NULL;
    uint32_t prompt_len = 0;
    if (!ex)
        ex = s_prompt(&c, prompt_text, prompt_ids, &prompt, &prompt_len);
    if (!ex && (uint64_t)c.ctx_len + prompt_len + max_new > c.cfg->max_positions) {
        kvedge_cli_error("decode: context (%u) + prompt (%u) + --max-new (%llu) tokens exceed the "
                         "model's %u positions",
                         c.ctx_len, prompt_len, (unsigned long long)max_new, c.cfg->max_positions);
        ex = KVEDGE_EXIT_USAGE;
    }
    enum { S_RUNS = 3 };
    static const kvedge_e2e_mode_t modes[S_RUNS] = {KVEDGE_E2E_KVEDGE, KVEDGE_E2E_LOCAL,
                                                    KVEDGE_E2E_CLOUD_ONLY};
    static const char *const keys[S_RUNS] = {"kvedge", "edge_only", "cloud_only"};
    int runs = compare ? S_RUNS : 1;
    /* Results are about 100 KiB each: on the heap. */
    kvedge_e2e_result_t *res = ex ? NULL : calloc(S_RUNS, sizeof *res);
    int32_t *tok[S_RUNS] = {NULL, NULL, NULL};
    bool oom = !ex && !res;
    for (int r = 0; !ex && r < runs; r++)
        oom = oom || !(tok[r] = calloc(max_new, sizeof *tok[r]));
    if (oom) {
        kvedge_cli_error("decode: out of memory");
        ex = KVEDGE_EXIT_FAILURE;
    }
    kvedge_client_t *proxy = NULL;
    if (!ex)
        ex = kvedge_cli_connect(cli, "kvedge decode", &proxy);
    /* A store node streams whatever it holds and a model it does not know would read as
     * "every layer missed": ask it first (a proxy refuses an unknown model itself). */
    const kvedge_node_info_t *peer = ex ? NULL : kvedge_client_node(proxy);
    if (peer && peer->role != KVEDGE_ROLE_PROXY && adapter) {
        kvedge_cli_error("decode: --adapter needs an edge proxy at -H (%s is a store node: only a "
                         "proxy serves another model's layers)",
                         cli->host);
        ex = KVEDGE_EXIT_USAGE;
    } else if (peer && peer->role != KVEDGE_ROLE_PROXY) {
        kvedge_model_t known;
        int rc = kvedge_client_get_model(proxy, c.model_id, &known);
        if (rc == KVEDGE_OK &&
            (known.layers != c.model.layers || known.kv_heads != c.model.kv_heads ||
             known.head_dim != c.model.head_dim))
            rc = KVEDGE_ESHAPE;
        if (rc != KVEDGE_OK)
            ex = s_remote_fail(&c, cli, rc);
    }
    kvedge_e2e_cloud_t *cloud = NULL;
    for (int r = 0; !ex && r < runs; r++) {
        kvedge_e2e_request_t req = {.mode = modes[r],
                                    .decoder = c.d,
                                    .ctx = c.ctx,
                                    .ctx_len = c.ctx_len,
                                    .prompt = prompt,
                                    .prompt_len = prompt_len,
                                    .max_new = (uint32_t)max_new,
                                    .repetition_penalty = (float)penalty,
                                    .chunk_tokens = (uint32_t)c.chunk_tokens,
                                    .deadline_ms = cli->deadline_ms};
        if (modes[r] == KVEDGE_E2E_KVEDGE) {
            req.proxy = proxy;
            req.model = &c.model;
            req.plan_recompute = plan_recompute;
            req.mapped_model = adapter ? &mapped : NULL;
            req.adapter = adapter;
            req.accept = n_accept ? accept : NULL;
            req.n_accept = n_accept;
            req.quality_metric = metric;
            req.quality_budget = budget;
        } else if (modes[r] == KVEDGE_E2E_CLOUD_ONLY) {
            /* The emulated cloud prefills the context here, outside any request's time. */
            int rc = kvedge_e2e_cloud_new(c.d, c.ctx, c.ctx_len, cloud_link, &cloud);
            if (rc != KVEDGE_OK) {
                kvedge_cli_error("decode: cannot start the emulated cloud model (link %s): %s",
                                 cloud_link, kvedge_strerror(rc));
                ex = KVEDGE_EXIT_FAILURE;
                break;
            }
            req.cloud = cloud;
        }
        int rc = kvedge_e2e_decode(&req, tok[r], &res[r]);
        if (rc != KVEDGE_OK)
            ex = s_decode_fail(&c, cli, modes[r], prompt_len, (uint32_t)max_new, rc);
        if (r == 0) /* the proxy is needed for the kvedge run only */
            kvedge_client_destroy(&proxy);
    }
    kvedge_client_destroy(&proxy);
    kvedge_e2e_cloud_destroy(&cloud);
    if (!ex) {
        uint32_t n = (uint32_t)max_new;
        uint32_t diff = s_agree(tok, runs, n);
        size_t text_len = 0;
        char *text = s_gen_text(&c, tok[0], n, &text_len);
        if (cli->json) {
            printf("{");
            for (int r = 0; r < runs; r++) {
                printf("%s\"%s\":", r ? "," : "", keys[r]);
                s_print_run_json(&res[r]);
            }
            printf(",\"model\":");
            kvedge_cli_json_str(stdout, c.model_id);
            printf(",\"context_tokens\":%u,\"prompt_tokens\":%u,\"tokens\":{", c.ctx_len,
                   prompt_len);
            for (int r = 0; r < runs; r++) {
                printf("%s\"%s\":[", r ? "," : "", keys[r]);
                s_print_ids(stdout, tok[r], n, ",");
                printf("]");
            }
            printf("},\"text\":");
            if (text) {
                kvedge_e2e_json_text(stdout, text, text_len);
            } else {
                printf("null");
            }
            if (compare) {
                double k = res[0].ttft_us > 0 ? res[0].ttft_us : 1;
                printf(",\"tokens_agree\":%s,\"first_token_agrees\":%s,"
                       "\"ttft_edge_only_over_kvedge\":%.3f,"
                       "\"ttft_cloud_only_over_kvedge\":%.3f,\"cloud_link\":",
                       diff == n ? "true" : "false", diff > 0 ? "true" : "false",
                       res[1].ttft_us / k, res[2].ttft_us / k);
                kvedge_cli_json_str(stdout, cloud_link);
            }
            printf("}\n");
        } else {
            if (!quiet)
                for (int r = 0; r < runs; r++) {
                    if (compare)
                        printf("== %s\n", kvedge_e2e_result_mode(&res[r]));
                    kvedge_e2e_print(stdout, &res[r], false);
                }
            if (!quiet && res[0].fetched == 0)
                printf("note: no layer came from %s: was the context prefilled there with the "
                       "same tokens, --model-id and --chunk-tokens?\n",
                       cli->host);
            printf("generated %u tokens: ", n);
            s_print_ids(stdout, tok[0], n, " ");
            if (text) {
                printf("\ntext: \"");
                fwrite(text, 1, text_len, stdout);
                printf("\"\n");
            } else {
                printf("\n");
            }
            if (compare) {
                char b[4][32];
                printf("\n%-11s %10s %10s %11s %11s %11s\n", "MODE", "TTFT ms", "TOTAL ms", "SENT",
                       "RECEIVED", "PROMPT UP");
                for (int r = 0; r < runs; r++)
                    printf("%-11s %10.2f %10.2f %11s %11s %11s\n", kvedge_e2e_result_mode(&res[r]),
                           res[r].ttft_us / 1e3, res[r].total_us / 1e3,
                           kvedge_cli_bytes(res[r].sent_bytes, b[0], 32),
                           kvedge_cli_bytes(res[r].received_bytes, b[1], 32),
                           kvedge_cli_bytes(res[r].prompt_bytes_sent, b[2], 32));
                double k = res[0].ttft_us > 0 ? res[0].ttft_us : 1;
                const char *mine = kvedge_e2e_result_mode(&res[0]); /* kvedge or ce-lslm */
                printf("TTFT edge-only / %s: %.2fx, cloud-only / %s: %.2fx (cloud link "
                       "%s; the cloud's prefill of the context is not timed)\n",
                       mine, res[1].ttft_us / k, mine, res[2].ttft_us / k, cloud_link);
                if (diff == n)
                    printf("tokens agree: yes (all %u equal in the three modes)\n", n);
                else
                    printf("tokens agree: no (first difference at token %u: K/V stored "
                           "quantized or in fp16 may change greedy picks)\n",
                           diff);
            }
        }
        free(text);
    }
    for (int r = 0; r < S_RUNS; r++)
        free(tok[r]);
    free(res);
    free(prompt);
    kvedge_adapter_destroy(&adapter);
    s_common_free(&c);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_e2e_cmds[] = {
    {"model-synth", s_cmd_synth, "--shape NAME --out FILE [--seed N] [--fp32]",
     "Write synthetic OPT weights of a named shape (opt-125m, opt-1.3b, ...).", NULL, NULL},
    {"prefill", s_cmd_prefill, "-H NODE --weights FILE --context... [--scheme S]",
     "Cloud role: prefill a shared context and put its K/V to a node.", NULL, NULL},
    {"decode", s_cmd_decode, "-H PROXY --weights FILE --context... --prompt TEXT [--compare]",
     "Edge role: decode a prompt on the context's K/V fetched through a proxy.", NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL, NULL},
};
