/* `kvedge model-synth`, `kvedge prefill` (the cloud role) and `kvedge decode` (the edge role,
 * with the edge-only and cloud-only baselines): clients/e2e/e2e.h from the command line. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/mview.h"
#include "access/shaper.h"
#include "clients/e2e/adapter.h"
#include "clients/cli/cli.h"
#include "clients/cli/cli_place.h"
#include "clients/cli/cli_llamacpp.h"
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
/* Most bytes of a --file read for the BPE tokenizer (the byte tokenizer reads only as
 * many bytes as it may use tokens). */
#define S_CONTEXT_MAX_BYTES (64u << 20)

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
    const char *add_bos;   /* --add-bos: auto, yes or no */
    bool special;          /* --special: special tokens in the text are their ids */
    bool bos;              /* resolved: the context starts with the tokenizer's BOS */
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

/* The options prefill and decode share, first in each one's options struct (as `c`). */
typedef struct {
    const char *weights, *model_id, *tokenizer, *add_bos;
    bool special;
    const char *file, *context, *context_ids;
    uint32_t tokens;       /* 0: as given */
    uint32_t chunk_tokens; /* 0: the default */
    const char *engine;    /* --engine: reference or llama.cpp */
    const char *gguf;      /* --gguf: the model for llama.cpp */
    const char *llama_cache;
    uint32_t threads;
} s_common_opts_t;

/* The table entries of s_common_opts_t, in an options struct T whose member c holds it. */
#define S_COMMON_LIST(T)                                                                           \
    {.name = "weights",                                                                            \
     .letter = 'w',                                                                                \
     .arg = "PATH",                                                                                \
     .type = KVEDGE_CMDOPT_STR,                                                                    \
     KVEDGE_CMDOPT_AT(T, c.weights),                                                               \
     .help = "the model: OPT weights (safetensors, Hugging Face names) or a Hugging Face "         \
             "model folder (config.json + safetensors: OPT, Llama, Mistral, Qwen2; its "           \
             "tokenizer.json is the default --tokenizer); `kvedge model-synth` makes "             \
             "synthetic ones; required"},                                                          \
        {.name = "model-id",                                                                       \
         .arg = "ID",                                                                              \
         .type = KVEDGE_CMDOPT_STR,                                                                \
         KVEDGE_CMDOPT_AT(T, c.model_id),                                                          \
         .def_text = "the shape's name",                                                           \
         .help = "the model's id on the store (a rotary model's gets its rotary settings' "        \
                 "@rope-XXXXXXXX suffix); required when the weights have no known shape "          \
                 "(kvedge model-synth --help lists them)"},                                        \
        {.name = "tokenizer",                                                                      \
         .arg = "PATH",                                                                            \
         .type = KVEDGE_CMDOPT_STR,                                                                \
         KVEDGE_CMDOPT_AT(T, c.tokenizer),                                                         \
         .help = "the BPE tokenizer of --file, --context and --prompt (and of decode's "           \
                 "text): a folder with vocab.json + merges.txt or tokenizer.json, or a "           \
                 "tokenizer.json; its ids must fit the model's vocabulary (`kvedge tokenize` "     \
                 "shows its ids)"},                                                                \
        {.name = "special",                                                                        \
         .type = KVEDGE_CMDOPT_BOOL,                                                               \
         KVEDGE_CMDOPT_AT(T, c.special),                                                           \
         .help = "special tokens written in the text (<|begin_of_text|>, <|im_start|>) are "       \
                 "their ids; without it they are text like any other"},                            \
        {.name = "add-bos",                                                                        \
         .arg = "WHEN",                                                                            \
         .type = KVEDGE_CMDOPT_STR,                                                                \
         KVEDGE_CMDOPT_AT(T, c.add_bos),                                                           \
         .def = "auto",                                                                            \
         .help = "auto, yes or no: start the context with the BOS token the tokenizer.json's "     \
                 "template adds (Llama 3's <|begin_of_text|>); auto: when the template has "       \
                 "one; yes: refused when it has none. Never before the prompt"},                   \
        {.name = "file",                                                                           \
         .arg = "FILE",                                                                            \
         .type = KVEDGE_CMDOPT_STR,                                                                \
         KVEDGE_CMDOPT_AT(T, c.file),                                                              \
         .alias = "context-file",                                                                  \
         .help = "the shared context: the text of FILE (without --tokenizer, the byte "            \
                 "tokenizer: byte b is token b+4, so the model needs at least 260 token ids)"},    \
        {.name = "context",                                                                        \
         .arg = "TEXT",                                                                            \
         .type = KVEDGE_CMDOPT_STR,                                                                \
         KVEDGE_CMDOPT_AT(T, c.context),                                                           \
         .help = "the shared context as text"},                                                    \
        {.name = "context-ids",                                                                    \
         .arg = "LIST",                                                                            \
         .type = KVEDGE_CMDOPT_STR,                                                                \
         KVEDGE_CMDOPT_AT(T, c.context_ids),                                                       \
         .help = "the shared context as token ids: 5,17,42,..."},                                  \
        {.name = "tokens",                                                                         \
         .arg = "N",                                                                               \
         .type = KVEDGE_CMDOPT_UINT,                                                               \
         KVEDGE_CMDOPT_AT(T, c.tokens),                                                            \
         .min = 1,                                                                                 \
         .max = UINT32_MAX,                                                                        \
         .def_text = "as given",                                                                   \
         .help = "exactly N context tokens: a longer context is cut to its first N tokens, a "     \
                 "shorter one repeated from its start until it has N (a small file stands in "     \
                 "for a long context)"},                                                           \
        {.name = "engine",                                                                         \
         .arg = "E",                                                                               \
         .type = KVEDGE_CMDOPT_STR,                                                                \
         KVEDGE_CMDOPT_AT(T, c.engine),                                                            \
         .def = "reference",                                                                       \
         .help = "reference (kvedge's decoder, --weights) or llama.cpp (--gguf, through the "      \
                 "llama.cpp bridge; docs/llamacpp.md)"},                                           \
        {.name = "gguf",                                                                           \
         .arg = "FILE",                                                                            \
         .type = KVEDGE_CMDOPT_STR,                                                                \
         KVEDGE_CMDOPT_AT(T, c.gguf),                                                              \
         .help = "--engine llama.cpp: the model as a GGUF file (llama or qwen2; its vocabulary "   \
                 "tokenizes --context, --file and --prompt)"},                                     \
        {.name = "llama-cache",                                                                    \
         .arg = "T",                                                                               \
         .type = KVEDGE_CMDOPT_STR,                                                                \
         KVEDGE_CMDOPT_AT(T, c.llama_cache),                                                       \
         .def = "f16",                                                                             \
         .help = "--engine llama.cpp: the KV cache's element type, f16 or f32"},                   \
        {.name = "threads",                                                                        \
         .arg = "N",                                                                               \
         .type = KVEDGE_CMDOPT_UINT,                                                               \
         KVEDGE_CMDOPT_AT(T, c.threads),                                                           \
         .min = 1,                                                                                 \
         .max = 1024,                                                                              \
         .def_text = "the CPUs, at most 4",                                                        \
         .help = "--engine llama.cpp: llama.cpp's threads"},                                       \
    {                                                                                              \
        .name = "chunk-tokens", .arg = "N", .type = KVEDGE_CMDOPT_UINT,                            \
        KVEDGE_CMDOPT_AT(T, c.chunk_tokens), .min = 1, .max = KVEDGE_BLOCK_MAX_TOKENS,             \
        .def_text = "256",                                                                         \
        .help = "context tokens per chunk; prefill and decode must agree, as on the model id "     \
                "and the context"                                                                  \
    }

/* The shared part of a command's runtime state from its options; the model id checked as
 * the line's value was. Returns an exit code. */
static int s_common_from(s_common_t *c, const char *cmd, const s_common_opts_t *o)
{
    *c = (s_common_t){.cmd = cmd,
                      .weights = o->weights,
                      .model_id = o->model_id,
                      .ctx_file = o->file,
                      .ctx_text = o->context,
                      .ctx_ids = o->context_ids,
                      .tokenizer = o->tokenizer,
                      .add_bos = o->add_bos,
                      .special = o->special,
                      .tokens = o->tokens,
                      .chunk_tokens = o->chunk_tokens};
    if (o->model_id && (!*o->model_id || strlen(o->model_id) > KVEDGE_MODEL_ID_MAX_BYTES)) {
        kvedge_cli_error("%s: bad value '%s' for --model-id", cmd, o->model_id);
        return KVEDGE_EXIT_USAGE;
    }
    if (o->add_bos && strcmp(o->add_bos, "auto") != 0 && strcmp(o->add_bos, "yes") != 0 &&
        strcmp(o->add_bos, "no") != 0) {
        kvedge_cli_error("%s: bad value '%s' for --add-bos (auto, yes or no)", cmd, o->add_bos);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

static void s_common_free(s_common_t *c)
{
    kvedge_tokenizer_destroy(&c->tok);
    kvedge_decoder_destroy(&c->d);
    free(c->ctx);
    c->ctx = NULL;
}

/* --engine: 1 llama.cpp, 0 the reference decoder, -1 a refused combination (reported). */
static int s_engine(const char *cmd, const s_common_opts_t *c)
{
    const bool llama = c->engine && strcmp(c->engine, "llama.cpp") == 0;
    const char *why = NULL;
    if (c->engine && !llama && strcmp(c->engine, "reference") != 0)
        why = "--engine is reference or llama.cpp";
    else if (!llama && (c->gguf || c->threads || (c->llama_cache && strcmp(c->llama_cache, "f16"))))
        why = "--gguf, --llama-cache and --threads go with --engine llama.cpp";
    else if (llama && (!c->gguf || c->weights || c->tokenizer))
        why = "--engine llama.cpp takes the model as --gguf FILE (its own vocabulary "
              "tokenizes), not --weights or --tokenizer";
    else if (llama && !c->model_id)
        why = "--engine llama.cpp needs --model-id ID (the rotary suffix is appended)";
    else if (llama && strcmp(c->llama_cache, "f16") != 0 && strcmp(c->llama_cache, "f32") != 0)
        why = "--llama-cache is f16 or f32 (the bridge does not write quantized caches)";
    else if (llama && (!!c->file + !!c->context + !!c->context_ids) != 1)
        why = "give the shared context once: --file, --context or --context-ids";
    else if (llama && c->add_bos && strcmp(c->add_bos, "auto") != 0)
        why = "--add-bos is for --engine reference (put the BOS id in --context-ids)";
    if (why) {
        kvedge_cli_error("%s: %s", cmd, why);
        return -1;
    }
    return llama ? 1 : 0;
}

/* The llama.cpp engine's arguments from the shared options. */
static void s_llamacpp_args(const char *cmd, const s_common_opts_t *c,
                            kvedge_cli_llamacpp_args_t *a)
{
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->gguf = c->gguf;
    a->model_id = c->model_id;
    a->file = c->file;
    a->context = c->context;
    a->context_ids = c->context_ids;
    a->special = c->special;
    a->tokens = c->tokens;
    a->chunk_tokens = c->chunk_tokens;
    a->cache = c->llama_cache;
    a->threads = c->threads;
}

#ifndef KVEDGE_HAVE_LLAMACPP
/* Without the bridge, --engine llama.cpp is refused, saying how to get it. */
static int s_no_llamacpp(const char *cmd)
{
    kvedge_cli_error("%s: --engine llama.cpp: this kvedge was built without llama.cpp (configure "
                     "with -DKVEDGE_LLAMACPP=DIR, a llama.cpp install; docs/llamacpp.md)",
                     cmd);
    return KVEDGE_EXIT_USAGE;
}
#endif

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
static int s_text_ids(const char *cmd, const char *flag, kvedge_tokenizer_t *tok, bool special,
                      const char *text, size_t len, uint32_t vocab, int32_t **out, uint32_t *n)
{
    if (tok) {
        int32_t *ids = NULL;
        size_t got = 0;
        int rc = kvedge_tokenizer_encode_ex(tok, text, len, special ? KVEDGE_TOKENIZER_SPECIAL : 0,
                                            &ids, &got);
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

/* Puts the tokenizer's BOS before the context's text ids (--add-bos). Returns an exit code. */
static int s_prepend_bos(const s_common_t *c, int32_t **ids, uint32_t *n)
{
    int32_t *more = realloc(*ids, ((size_t)*n + 1) * sizeof **ids);
    if (!more) {
        kvedge_cli_error("%s: out of memory", c->cmd);
        return KVEDGE_EXIT_FAILURE;
    }
    memmove(more + 1, more, (size_t)*n * sizeof *more);
    more[0] = kvedge_tokenizer_bos_id(c->tok);
    *ids = more;
    *n += 1;
    return KVEDGE_EXIT_OK;
}

/* The context's tokens from the one of --file, --context, --context-ids given (checked
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
        ex = len ? s_text_ids(c->cmd, c->ctx_file ? "--file" : "--context", c->tok, c->special,
                              text, len, c->cfg->vocab, &ids, &n)
                 : KVEDGE_EXIT_OK;
        free(buf);
        if (!ex && c->bos)
            ex = s_prepend_bos(c, &ids, &n);
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
    const char *name;
    for (size_t i = 0; (name = kvedge_decoder_shape_name(i)) != NULL; i++) {
        kvedge_decoder_config_t s;
        if (kvedge_decoder_shape(name, &s) == KVEDGE_OK && s.layers == got->layers &&
            s.heads == got->heads && s.kv_heads == got->kv_heads && s.head_dim == got->head_dim &&
            s.hidden == got->hidden && s.ffn == got->ffn && s.vocab == got->vocab &&
            s.max_positions == got->max_positions)
            return name;
    }
    return NULL;
}

/* Loads --tokenizer (a folder, or a tokenizer.json) and checks that its ids fit the model's
 * embedding rows. Returns an exit code: 2 for a refused file or one that does not fit, 1 when
 * it cannot be read. */
static int s_load_tokenizer(s_common_t *c)
{
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    int rc = kvedge_tokenizer_load_path(c->tokenizer, &c->tok, why, sizeof why);
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

/* The tokenizer: --tokenizer, else a model folder's own tokenizer.json; then --special and
 * --add-bos against it. Returns an exit code. */
static int s_tokenizer_setup(s_common_t *c)
{
    char own[4096];
    if (!c->tokenizer && kvedge_cli_own_tokenizer(c->weights, own, sizeof own))
        c->tokenizer = own;
    if (c->tokenizer) {
        int ex = s_load_tokenizer(c);
        if (c->tokenizer == own)
            c->tokenizer = c->weights; /* own is about to go out of scope */
        if (ex)
            return ex;
    }
    bool yes = c->add_bos && strcmp(c->add_bos, "yes") == 0,
         no = c->add_bos && strcmp(c->add_bos, "no") == 0;
    if ((c->special || yes) && !c->tok) {
        kvedge_cli_error("%s: %s needs a tokenizer (--tokenizer, or a model folder with a "
                         "tokenizer.json)",
                         c->cmd, c->special ? "--special" : "--add-bos yes");
        return KVEDGE_EXIT_USAGE;
    }
    int32_t bos = c->tok ? kvedge_tokenizer_bos_id(c->tok) : -1;
    if (yes && bos < 0) {
        kvedge_cli_error("%s: --add-bos yes, but the tokenizer %s adds no BOS token (its "
                         "template has none)",
                         c->cmd, c->tokenizer);
        return KVEDGE_EXIT_USAGE;
    }
    c->bos = !no && bos >= 0 && !c->ctx_ids;
    return KVEDGE_EXIT_OK;
}

/* Loads the weights, settles the model id and its record, and reads the context. Returns an
 * exit code; on failure the caller still calls s_common_free. */
static int s_common_load(s_common_t *c)
{
    if (!c->weights) {
        kvedge_cli_error(
            "%s: --weights FILE is required (an OPT safetensors file or a Hugging Face model "
            "folder; `kvedge model-synth --shape opt-125m --out FILE` makes some)",
            c->cmd);
        return KVEDGE_EXIT_USAGE;
    }
    int given = !!c->ctx_file + !!c->ctx_text + !!c->ctx_ids;
    if (given != 1) { /* before the weights: a usage error should not wait for a load */
        kvedge_cli_error("%s: give the shared context once: --file F, --context TEXT or "
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
    int ex = s_tokenizer_setup(c);
    if (ex)
        return ex;
    if (!c->model_id) {
        c->model_id = s_shape_name(c->cfg);
        if (!c->model_id) {
            kvedge_cli_error("%s: %s has no known shape (%u layers, %u query / %u KV heads, "
                             "hidden %u): give --model-id ID",
                             c->cmd, c->weights, c->cfg->layers, c->cfg->heads, c->cfg->kv_heads,
                             c->cfg->hidden);
            return KVEDGE_EXIT_USAGE;
        }
    }
    rc = kvedge_e2e_model(c->d, c->model_id, &c->model);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: model '%s' cannot be stored: %s (%u layers, %u KV heads of %u)%s",
                         c->cmd, c->model_id, kvedge_strerror(rc), c->cfg->layers, c->cfg->kv_heads,
                         c->cfg->head_dim,
                         rc == KVEDGE_ESHAPE ? ": the id's @rope- suffix is another model's "
                                               "rotary settings"
                                             : "");
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
                         "prefilled on it (same --model-id and, for a rotary model, the same "
                         "rotary settings: its @rope- suffix), a proxy the built-in ones (kvedge "
                         "models) and those registered with its master",
                         c->cmd, cli->host, c->model.id[0] ? c->model.id : c->model_id);
        break;
    case KVEDGE_ESHAPE:
        kvedge_cli_error("%s: model '%s' on %s has another shape than %s (%u layers, %u KV heads "
                         "of %u): use another --model-id",
                         c->cmd, c->model.id, cli->host, c->weights, c->cfg->layers,
                         c->cfg->kv_heads, c->cfg->head_dim);
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

/* What `kvedge model-synth` runs on. */
typedef struct {
    const char *shape, *out;
    uint64_t seed;
    bool fp32;
} s_synth_opts_t;

static const kvedge_cmdopt_t s_synth_list[] = {
    {.name = "shape",
     .letter = 's',
     .arg = "NAME",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, shape),
     .required = true,
     .help = "opt-125m, opt-1.3b, opt-2.7b, opt-tiny (the test fixture's shape), "
             "llama-3.2-1b, llama-3.2-3b, qwen2.5-0.5b, qwen2.5-1.5b or smollm2-360m"},
    {.name = "out",
     .letter = 'o',
     .arg = "PATH",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, out),
     .required = true,
     .help = "where to write: a safetensors file for an OPT shape, a model folder (created) "
             "for a Llama-family one; files via a temporary file, renamed"},
    {.name = "seed",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, seed),
     .min = 0,
     .max = UINT64_MAX,
     .help = "random seed; the same seed writes the same bytes"},
    {.name = "fp32",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_synth_opts_t, fp32),
     .help = "fp32 tensors (twice the size)"},
};

static const kvedge_cmdopts_t s_synth_opts = {
    .command = "model-synth",
    .summary = "Write synthetic weights of a named shape (opt-125m, llama-3.2-1b, ...).",
    .about = "Writes synthetic weights of a released model's shape: for OPT a safetensors file\n"
             "with the Hugging Face tensor names and __metadata__; for the Llama family\n"
             "(llama-3.2-1b/3b, qwen2.5-0.5b/1.5b, smollm2-360m) a Hugging Face model folder:\n"
             "config.json (the published sizes, query and KV heads, rope_theta, Llama 3.2's\n"
             "rope_scaling) and model.safetensors. Seeded normal weights (std 0.02), norms 1,\n"
             "biases 0, fp16 unless --fp32. The text they generate means nothing, but every size\n"
             "and cost is that of the real model, so prefill, decode and the benchmarks run where\n"
             "the real weights are not at hand.\n",
    KVEDGE_CMDOPTS_OF(s_synth_opts_t, s_synth_list)};

/* What model-synth wrote. */
typedef struct {
    kvedge_decoder_config_t c;
    uint64_t params, bytes;
    double ms;
} s_synth_t;

/* Writes the weights and counts what was written. Returns an exit code. */
static int s_synth_run(const s_synth_opts_t *o, s_synth_t *r)
{
    if (kvedge_decoder_shape(o->shape, &r->c) != KVEDGE_OK) {
        kvedge_cli_error("model-synth: unknown shape '%s' (opt-125m, opt-1.3b, opt-2.7b, "
                         "opt-tiny, llama-3.2-1b, llama-3.2-3b, qwen2.5-0.5b, qwen2.5-1.5b, "
                         "smollm2-360m)",
                         o->shape);
        return KVEDGE_EXIT_USAGE;
    }
    double t0 = s_now_ms();
    errno = 0;
    int rc = kvedge_decoder_synthesize_shape(o->shape, o->out, o->seed, !o->fp32);
    int err = errno;
    r->ms = s_now_ms() - t0;
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("model-synth: cannot write %s: %s%s%s", o->out, kvedge_strerror(rc),
                         rc == KVEDGE_EIO && err ? ": " : "",
                         rc == KVEDGE_EIO && err ? strerror(err) : "");
        return KVEDGE_EXIT_FAILURE;
    }
    /* Count what was written rather than what the shape implies. */
    struct stat st;
    char file[4096];
    const char *arch = kvedge_decoder_shape_arch(o->shape);
    snprintf(file, sizeof file, "%s%s", o->out,
             arch && strcmp(arch, "opt") != 0 ? "/model.safetensors" : "");
    kvedge_safetensors_t *f = kvedge_safetensors_new();
    rc = f ? kvedge_safetensors_open(f, file) : KVEDGE_ENOMEM;
    for (size_t i = 0; rc == KVEDGE_OK && i < kvedge_safetensors_count(f); i++)
        r->params += kvedge_safetensors_at(f, i)->numel;
    kvedge_safetensors_destroy(&f);
    if (rc != KVEDGE_OK || stat(file, &st) != 0) {
        kvedge_cli_error("model-synth: wrote %s but cannot read it back: %s", o->out,
                         kvedge_strerror(rc != KVEDGE_OK ? rc : KVEDGE_EIO));
        return KVEDGE_EXIT_FAILURE;
    }
    r->bytes = (uint64_t)st.st_size;
    return KVEDGE_EXIT_OK;
}

static void s_synth_print(const kvedge_cli_t *cli, const s_synth_opts_t *o, const s_synth_t *r)
{
    const kvedge_decoder_config_t *c = &r->c;
    const char *dtype = o->fp32 ? "fp32" : "fp16";
    char b[32];
    if (cli->json) {
        printf("{\"path\":");
        kvedge_cli_json_str(stdout, o->out);
        printf(",\"shape\":\"%s\",\"arch\":\"%s\",\"layers\":%u,\"heads\":%u,\"kv_heads\":%u,"
               "\"head_dim\":%u,\"hidden\":%u,\"ffn\":%u,"
               "\"vocab\":%u,\"max_positions\":%u,\"parameters\":%llu,\"bytes\":%llu,"
               "\"dtype\":\"%s\",\"seed\":%llu,\"ms\":%.1f}\n",
               o->shape, kvedge_decoder_shape_arch(o->shape), c->layers, c->heads, c->kv_heads,
               c->head_dim, c->hidden, c->ffn, c->vocab, c->max_positions,
               (unsigned long long)r->params, (unsigned long long)r->bytes, dtype,
               (unsigned long long)o->seed, r->ms);
        return;
    }
    printf("wrote %s: %s (%s, %u layers, %u query / %u KV heads of %u, hidden %u, ffn %u, vocab "
           "%u, %u positions)\n",
           o->out, o->shape, kvedge_decoder_shape_arch(o->shape), c->layers, c->heads, c->kv_heads,
           c->head_dim, c->hidden, c->ffn, c->vocab, c->max_positions);
    printf("%.2f M parameters, %s %s, seed %llu, in %.1f s\n", (double)r->params / 1e6,
           kvedge_cli_bytes(r->bytes, b, sizeof b), dtype, (unsigned long long)o->seed,
           r->ms / 1e3);
}

static int s_synth(kvedge_cli_t *cli, const void *opts)
{
    s_synth_t r = {0};
    int ex = s_synth_run(opts, &r);
    if (!ex)
        s_synth_print(cli, opts, &r);
    return ex;
}

/* ---------------------------------------------------------------- prefill */

/* What `kvedge prefill` runs on. */
typedef struct {
    s_common_opts_t c;
    const char *scheme, *dtype, *layers;
    uint32_t group, keep_channels, ttl_s;
    bool pin, mapped_only;
    const char *master, *master_pub, *master_key;
    uint32_t replicas, write_quorum; /* 0: not given */
} s_prefill_opts_t;

static const kvedge_cmdopt_t s_prefill_list[] = {
    S_COMMON_LIST(s_prefill_opts_t),
    {.name = "scheme",
     .arg = "S",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, scheme),
     .def = "int8",
     .help = "int8, int4 or lossless"},
    {.name = "dtype",
     .arg = "D",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, dtype),
     .def = "fp16",
     .help = "fp16 or fp32: lossless blocks' element type"},
    {.name = "group",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, group),
     .max = UINT16_MAX,
     .def_text = "the codec's",
     .help = "int4 group size"},
    {.name = "keep-channels",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, keep_channels),
     .max = UINT16_MAX,
     .def_text = "all",
     .help = "ThinK: key channels kept per head"},
    {.name = "pin",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, pin),
     .help = "pin the blocks (never evicted)"},
    {.name = "ttl",
     .arg = "S",
     .type = KVEDGE_CMDOPT_SECONDS,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, ttl_s),
     .min = 1,
     .max = UINT32_MAX,
     .def_text = "the node's",
     .help = "expire after S seconds"},
    {.name = "layers",
     .arg = "LIST",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, layers),
     .help = "prune: put only these layers (0,1,4); the others are computed (deeper layers "
             "need them) but not stored"},
    {.name = "mapped-only",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, mapped_only),
     .help = "prune: put only the layers that the layer maps registered for this model "
             "(map/MODEL/EDGE at --master) use, their union; refused when no map names the "
             "model"},
    {.name = "master",
     .arg = "EPS",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, master),
     .help = "the Storage Master's ROUTER, or a list EP[,EP...] of the masters of one cluster: "
             "without -H, prefill puts to the placement among the cloud nodes registered "
             "there; with -H, only for --mapped-only's maps"},
    {.name = "master-pub",
     .arg = "EPS",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, master_pub),
     .def_text = "for tcp://HOST:PORT, PORT+1",
     .help = "the master's PUB"},
    {.name = "master-key",
     .arg = "KEY",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, master_key),
     .help = "the master's public key or certificate (none: plaintext, loopback and ipc only; "
             "with the global --cert)"},
    {.name = "replicas",
     .arg = "R",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, replicas),
     .min = 1,
     .max = KVEDGE_PLACED_MAX_REPLICAS,
     .def_text = "2",
     .help = "with --master: put the context to the R cloud nodes its placement names "
             "(fewer nodes up: all of them, and it says so)"},
    {.name = "write-quorum",
     .arg = "W",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_prefill_opts_t, write_quorum),
     .min = 1,
     .max = KVEDGE_PLACED_MAX_REPLICAS,
     .def_text = "R",
     .help = "with --master: the write succeeds when W replicas acknowledged every block "
             "(W <= R); fewer: exit 1, naming the replicas that failed"},
};

static const kvedge_cmdopts_t s_prefill_opts = {
    .command = "prefill",
    .summary = "Cloud role: prefill a shared context and put its K/V to a node.",
    .about =
        "Run as `kvedge -H NODE [--server-key KEY --cert FILE] prefill ...` (-H goes before\n"
        "the command), or `kvedge [--cert FILE] prefill --master EP [--replicas R]\n"
        "[--write-quorum W] ...` to put to the placement. Give the shared context once:\n"
        "--file, --context or --context-ids.\n\n"
        "The cloud role: runs the shared context through the model and puts its K/V to the\n"
        "store node at -H, one block per (chunk, layer, KV head), quantized as asked, under the\n"
        "model id (registered on the node). Edges then decode on top of it with `kvedge -H PROXY\n"
        "decode` given the same weights, model id, context and --chunk-tokens. Prints the chunk\n"
        "chain, the blocks and bytes stored against fp16, and the time of each step.\n\n"
        "A request of this model for a layer that was not stored is a miss, which the edge\n"
        "computes; an edge model's MAPPED request asks only for the layers its map names, which\n"
        "--mapped-only keeps. Layers an earlier prefill stored stay (kvedge delete removes "
        "them).\n\n"
        "Placement (--master without -H): the cloud nodes registered with the master (their\n"
        "capacity the weight, their health up or suspect) are ranked by weighted rendezvous\n"
        "hashing on the context's root chunk id, so every chunk of the chain goes to the same\n"
        "R nodes (R 2 by default; fewer nodes up: all of them). The model is registered and\n"
        "every block put on each replica at once; the write is acknowledged when W replicas\n"
        "(W = R by default) have every block, and prints `replicas: stored on N of R (nodes)\n"
        "W=w`. Fewer than W: exit 1, naming each replica that failed and why. No cloud node up\n"
        "with a capacity: exit 5 before anything is computed.\n\n"
        "exit codes: 2 usage (also weights of no known shape without --model-id, a --tokenizer\n"
        "refused or whose ids do not fit the model, a bad --layers), 1 weights or a tokenizer\n"
        "that cannot be read or a failed put, 3 --mapped-only with no map naming the model (or\n"
        "maps that use none of its layers), 4 a map that does not fit the model, 5 node or\n"
        "master unreachable.\n",
    KVEDGE_CMDOPTS_OF(s_prefill_opts_t, s_prefill_list)};

/* Where --mapped-only reads the maps. */
typedef struct {
    const char *master, *pub, *key, *cert;
    int deadline_ms;
} s_master_t;

/* A synced snapshot of the master's records under prefix, for command cmd (messages say
 * "cmd: ..." and, when there is none, then what happens: `then`). Returns an exit code: 2 for
 * flags or a transport that cannot be used, 1 when the view cannot start, 5 for no snapshot
 * within ms->deadline_ms. */
static int s_master_view(const char *cmd, const s_master_t *ms, const char *prefix,
                         const char *then, kvedge_mview_t **v)
{
    char pub[300];
    *v = NULL;
    if (!kvedge_cli_master_pubs(cmd, "master", ms->master, "master-pub", ms->pub, pub, sizeof pub))
        return KVEDGE_EXIT_USAGE;
    if (ms->key && !ms->cert) {
        kvedge_cli_error("%s: --master-key needs --cert (this client's secret certificate)", cmd);
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = ms->master;
    vo.pub = ms->pub ? ms->pub : pub;
    vo.server_key = ms->key;
    vo.client_cert = ms->key ? ms->cert : NULL;
    vo.prefix = prefix;
    vo.start_wait_ms = ms->deadline_ms;
    int rc = kvedge_mview_start(&vo, v);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("%s: cannot reach the master: %s%s", cmd, kvedge_strerror(rc),
                         rc == KVEDGE_EDENIED ? " (plaintext is for loopback and ipc only: give "
                                                "--master-key and --cert)"
                                              : "");
        return rc == KVEDGE_EINVAL || rc == KVEDGE_EDENIED ? KVEDGE_EXIT_USAGE
                                                           : KVEDGE_EXIT_FAILURE;
    }
    if (kvedge_mview_state(*v) != KVEDGE_MVIEW_SYNCED) {
        kvedge_cli_error("%s: no snapshot from the master at %s within %d ms (master down, "
                         "wrong endpoint, or key not allowed); %s",
                         cmd, ms->master, ms->deadline_ms, then);
        kvedge_mview_destroy(v);
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    return KVEDGE_EXIT_OK;
}

/* --mapped-only: the union of the layers the maps naming model m use (kvedge_prune_from_view
 * on a snapshot of map/<m>/). edges receives their edge ids. Returns an exit code. */
static int s_mapped_layers(const s_master_t *ms, const kvedge_model_t *m, kvedge_prune_set_t *keep,
                           size_t *n_maps, char *edges, size_t edges_cap)
{
    char prefix[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
    if (kvedge_master_key_format(KVEDGE_MASTER_SPACE_MAP, m->id, "x", prefix, sizeof prefix) !=
        KVEDGE_OK) {
        kvedge_cli_error("prefill: '%s' is not a registry model id (1..%u printable bytes, no "
                         "'/'): no map can name it, so --mapped-only cannot be used",
                         m->id, KVEDGE_MASTER_MAX_MODEL_ID_BYTES);
        return KVEDGE_EXIT_USAGE;
    }
    prefix[strlen(prefix) - 1] = '\0'; /* map/<model>/ */
    kvedge_mview_t *v = NULL;
    int rc, ex = s_master_view("prefill", ms, prefix, "nothing stored", &v);
    char why[KVEDGE_PRUNE_WHY_BYTES] = "";
    if (!ex && (rc = kvedge_prune_from_view(v, m->id, m->layers, keep, n_maps, edges, edges_cap,
                                            why, sizeof why)) != KVEDGE_OK) {
        kvedge_cli_error("prefill: --mapped-only: %s; nothing stored", why);
        ex = rc == KVEDGE_ENOTFOUND                         ? KVEDGE_EXIT_NOTFOUND
             : rc == KVEDGE_ECORRUPT || rc == KVEDGE_EPROTO ? KVEDGE_EXIT_CORRUPT
                                                            : KVEDGE_EXIT_FAILURE;
    }
    kvedge_mview_destroy(&v);
    return ex;
}

/* What prefill works on and what it did. */
typedef struct {
    s_common_t c;
    kvedge_e2e_quant_t q;
    kvedge_prune_set_t keep;
    size_t n_maps;
    char edges[1024]; /* --mapped-only: the edge models of the maps */
    uint32_t ct;      /* tokens per chunk */
    kvedge_chunk_id_t *ids;
    size_t n_ids;
    kvedge_e2e_prefill_stats_t st;
    /* Placement (--master without -H): the tier read from the master, the writer. */
    kvedge_placed_node_t *tier;
    size_t n_tier;
    kvedge_placed_t *pw;
} s_prefill_t;

static int s_prefill_flags(const kvedge_cli_t *cli, const s_prefill_opts_t *o);

/* The values the table cannot check (--scheme, --dtype, the syntax of --layers; its range
 * once the weights say how many layers there are) into r->q, then which flags go together.
 * Returns an exit code. */
static int s_prefill_check(const kvedge_cli_t *cli, const s_prefill_opts_t *o, s_prefill_t *r)
{
    char why[KVEDGE_PRUNE_WHY_BYTES] = "";
    kvedge_prune_set_t syntax;
    kvedge_e2e_quant_default(&r->q);
    int ex = s_common_from(&r->c, "prefill", &o->c);
    const char *flag = NULL, *val = NULL, *hint = "";
    if (ex)
        return ex;
    if (kvedge_scheme_parse(o->scheme, &r->q.scheme) != KVEDGE_OK)
        flag = "scheme", val = o->scheme, hint = " (int8, int4 or lossless)";
    else if (kvedge_dtype_parse(o->dtype, &r->q.dtype) != KVEDGE_OK ||
             (r->q.dtype != KVEDGE_DTYPE_FP16 && r->q.dtype != KVEDGE_DTYPE_FP32))
        flag = "dtype", val = o->dtype, hint = " (fp16 or fp32)";
    else if (o->layers &&
             kvedge_prune_parse(o->layers, KVEDGE_MODEL_MAX_LAYERS, &syntax, why, sizeof why) !=
                 KVEDGE_OK &&
             !strstr(why, "out of range"))
        flag = "layers", val = o->layers, hint = ": ";
    if (flag) {
        kvedge_cli_error("prefill: bad value '%s' for --%s%s%s", val, flag, hint,
                         strcmp(flag, "layers") == 0 ? why : "");
        return KVEDGE_EXIT_USAGE;
    }
    r->q.group_size = (uint16_t)o->group;
    r->q.keep_channels = (uint16_t)o->keep_channels;
    r->q.pin = o->pin;
    r->q.ttl_s = o->ttl_s;
    return s_prefill_flags(cli, o);
}

/* Which flags go together: -H (one node) or --master (the placement), and what goes with
 * each. Returns an exit code. */
static int s_prefill_flags(const kvedge_cli_t *cli, const s_prefill_opts_t *o)
{
    if (!cli->host && !o->master) {
        kvedge_cli_error("prefill: needs -H NODE (the store node to put the context's K/V to) or "
                         "--master EP (put it to the placement among the cloud nodes registered "
                         "with that master)");
        return KVEDGE_EXIT_USAGE;
    }
    if (cli->host && (o->replicas || o->write_quorum)) {
        kvedge_cli_error("prefill: --replicas and --write-quorum go with --master and without "
                         "-H: -H puts to that one node");
        return KVEDGE_EXIT_USAGE;
    }
    uint32_t r = o->replicas ? o->replicas : KVEDGE_PLACED_REPLICAS_DEFAULT;
    if (o->write_quorum > r) {
        kvedge_cli_error("prefill: --write-quorum %u is more than the %u replicas asked "
                         "(--replicas): W <= R",
                         o->write_quorum, r);
        return KVEDGE_EXIT_USAGE;
    }
    if (o->layers && o->mapped_only) {
        kvedge_cli_error("prefill: give --layers LIST or --mapped-only, not both");
        return KVEDGE_EXIT_USAGE;
    }
    if (!o->master && (o->master_pub || o->master_key)) {
        kvedge_cli_error("prefill: --master-pub and --master-key go with --master");
        return KVEDGE_EXIT_USAGE;
    }
    if (cli->host && o->mapped_only != (o->master != NULL)) {
        kvedge_cli_error("prefill: --mapped-only needs --master EP (the Storage Master holding "
                         "the layer maps), and --master, --master-pub and --master-key go with "
                         "--mapped-only");
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

/* Pruning: the set of layers to put (--layers, or --mapped-only's maps), settled before
 * anything is computed or stored; r->q.layers points at it. Returns an exit code. */
static int s_prefill_layers(const kvedge_cli_t *cli, const s_prefill_opts_t *o, s_prefill_t *r)
{
    char why[KVEDGE_PRUNE_WHY_BYTES] = "";
    int ex = KVEDGE_EXIT_OK;
    if (o->layers) {
        if (kvedge_prune_parse(o->layers, r->c.cfg->layers, &r->keep, why, sizeof why) !=
            KVEDGE_OK) {
            kvedge_cli_error("prefill: bad value '%s' for --layers: %s", o->layers, why);
            ex = KVEDGE_EXIT_USAGE;
        }
    } else if (o->mapped_only) {
        s_master_t ms = {o->master, o->master_pub, o->master_key, cli->cert,
                         cli->deadline_ms > 0 ? cli->deadline_ms : KVEDGE_MVIEW_SNAPSHOT_MS};
        ex = s_mapped_layers(&ms, &r->c.model, &r->keep, &r->n_maps, r->edges, sizeof r->edges);
    }
    if (!ex && (o->layers || o->mapped_only))
        r->q.layers = &r->keep;
    return ex;
}

/* Connects to the node at -H (refusing a proxy, which would refuse each PUT as invalid) and
 * puts the context's K/V. Returns an exit code. */
static int s_prefill_put(kvedge_cli_t *cli, s_prefill_t *r)
{
    kvedge_client_t *node = NULL;
    int ex = kvedge_cli_connect(cli, "kvedge prefill", &node);
    const kvedge_node_info_t *peer = ex ? NULL : kvedge_client_node(node);
    if (peer && peer->role == KVEDGE_ROLE_PROXY) {
        kvedge_cli_error("prefill: %s is an edge proxy (%s), not a store node: prefill puts the "
                         "context's K/V to a store node (the cloud node the proxy fetches from)",
                         cli->host, peer->name);
        ex = KVEDGE_EXIT_USAGE;
    }
    r->ct = r->c.chunk_tokens ? (uint32_t)r->c.chunk_tokens : KVEDGE_E2E_CHUNK_TOKENS_DEFAULT;
    size_t max = ex ? 0 : (r->c.ctx_len + r->ct - 1) / r->ct;
    r->ids = ex ? NULL : calloc(max, sizeof *r->ids);
    if (!ex && !r->ids) {
        kvedge_cli_error("prefill: out of memory");
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (!ex) {
        const s_common_t *c = &r->c;
        int rc = kvedge_e2e_prefill(node, c->d, &c->model, c->ctx, c->ctx_len, r->ct, &r->q, r->ids,
                                    max, &r->st);
        if (rc == KVEDGE_EINVAL) {
            kvedge_cli_error("prefill: the node or codec refused these settings (scheme %s, "
                             "dtype %s, group %u, keep-channels %u of %u): %s",
                             kvedge_scheme_name(r->q.scheme), kvedge_dtype_name(r->q.dtype),
                             r->q.group_size, r->q.keep_channels, c->cfg->head_dim,
                             kvedge_strerror(rc));
            ex = KVEDGE_EXIT_USAGE;
        } else if (rc != KVEDGE_OK) {
            ex = s_remote_fail(c, cli, rc);
        } else if (strcmp(c->model.id, c->model_id) != 0 &&
                   kvedge_model_builtin(c->model_id, &(kvedge_model_t){0}) != KVEDGE_OK) {
            /* The plain id too, with no blocks: a decode by a model of other rotary settings
             * then learns that the context is there, for another model (s_decode_connect).
             * A built-in id needs none (every node knows it); one another client registered
             * with another shape keeps it. */
            kvedge_model_t plain = c->model;
            snprintf(plain.id, sizeof plain.id, "%s", c->model_id);
            rc = kvedge_client_put_model(node, &plain);
            if (rc != KVEDGE_OK && rc != KVEDGE_ESHAPE)
                ex = s_remote_fail(c, cli, rc);
        }
        r->n_ids = r->st.n_chunks ? r->st.n_chunks : max;
    }
    kvedge_client_destroy(&node);
    return ex;
}

/* Placement: the cloud tier from the master, refused before the weights are loaded when it
 * names no usable node (or fewer than W). Returns an exit code. */
static int s_prefill_tier(const kvedge_cli_t *cli, const s_prefill_opts_t *o, s_prefill_t *r)
{
    kvedge_cli_tier_src_t src = {
        "prefill",     o->master,
        o->master_pub, o->master_key,
        cli->cert,     cli->deadline_ms > 0 ? cli->deadline_ms : KVEDGE_MVIEW_SNAPSHOT_MS};
    int ex = kvedge_cli_tier_read(&src, &r->tier, &r->n_tier);
    if (ex)
        return ex;
    size_t usable = kvedge_placed_usable(r->tier, r->n_tier);
    if (usable == 0) {
        kvedge_cli_tier_explain("prefill", r->tier, r->n_tier);
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    if (o->write_quorum > usable) {
        kvedge_cli_error("prefill: --write-quorum %u cannot be met: %zu cloud node%s up with a "
                         "capacity; nothing computed or stored",
                         o->write_quorum, usable, usable == 1 ? "" : "s");
        return KVEDGE_EXIT_UNAVAILABLE;
    }
    return KVEDGE_EXIT_OK;
}

/* "stored on N of R (a, b) W=w", then what differs from the plain case: fewer replicas than
 * asked, replicas that failed and why. */
static void s_replicas_text(const s_prefill_t *r, char *out, size_t cap)
{
    const kvedge_placed_t *pw = r->pw;
    size_t at = 0;
#define S_ADD(...)                                                                                 \
    do {                                                                                           \
        int k_ = snprintf(out + at, cap - at, __VA_ARGS__);                                        \
        at += k_ > 0 && (size_t)k_ < cap - at ? (size_t)k_ : cap - at - 1;                         \
    } while (0)
    S_ADD("stored on %u of %u (", kvedge_placed_acked(pw), kvedge_placed_count(pw));
    kvedge_placed_replica_t rep;
    for (uint32_t i = 0, k = 0; i < kvedge_placed_count(pw); i++)
        if (kvedge_placed_replica(pw, i, &rep) == KVEDGE_OK && rep.connected && rep.status == 0)
            S_ADD("%s%s", k++ ? ", " : "", rep.id);
    S_ADD(") W=%u", kvedge_placed_quorum(pw));
    if (kvedge_placed_asked(pw) > kvedge_placed_count(pw))
        S_ADD("; asked %u, %zu cloud node%s up with a capacity", kvedge_placed_asked(pw),
              kvedge_placed_usable(r->tier, r->n_tier),
              kvedge_placed_usable(r->tier, r->n_tier) == 1 ? "" : "s");
    for (uint32_t i = 0; i < kvedge_placed_count(pw); i++)
        if (kvedge_placed_replica(pw, i, &rep) == KVEDGE_OK && (!rep.connected || rep.status))
            S_ADD("; %s (%s) failed: %s%s%s", rep.id, rep.endpoint, kvedge_strerror(rep.status),
                  rep.error[0] ? ": " : "", rep.error);
#undef S_ADD
}

/* Puts the context to its placement: the writer for its root chunk, connected, then
 * kvedge_e2e_prefill_placed. Returns an exit code. */
static int s_prefill_put_placed(const kvedge_cli_t *cli, const s_prefill_opts_t *o, s_prefill_t *r)
{
    const s_common_t *c = &r->c;
    r->ct = c->chunk_tokens ? (uint32_t)c->chunk_tokens : KVEDGE_E2E_CHUNK_TOKENS_DEFAULT;
    size_t max = (c->ctx_len + r->ct - 1) / r->ct;
    r->ids = calloc(max, sizeof *r->ids);
    if (!r->ids) {
        kvedge_cli_error("prefill: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    /* The root chunk is the placement's key; the chain is computed again by the prefill. */
    int rc = kvedge_e2e_chunks(&c->model, c->ctx, c->ctx_len, r->ct, r->ids, max, &r->n_ids);
    kvedge_placed_opts_t po;
    kvedge_placed_opts_default(&po);
    po.replicas = o->replicas;
    po.write_quorum = o->write_quorum;
    po.client_cert = cli->cert;
    po.deadline_ms = cli->deadline_ms;
    po.name = "kvedge prefill";
    if (rc == KVEDGE_OK)
        rc = kvedge_placed_new(&po, r->tier, r->n_tier, &r->ids[0], &r->pw);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("prefill: no placement for this context: %s", kvedge_strerror(rc));
        return rc == KVEDGE_EINVAL ? KVEDGE_EXIT_USAGE : KVEDGE_EXIT_FAILURE;
    }
    rc = kvedge_placed_connect(r->pw);
    if (rc == KVEDGE_OK)
        rc = kvedge_e2e_prefill_placed(r->pw, c->d, &c->model, c->ctx, c->ctx_len, r->ct, &r->q,
                                       r->ids, max, &r->st);
    /* The plain id too, as with -H (s_prefill_put), on every replica that has the blocks. */
    bool plain = strcmp(c->model.id, c->model_id) != 0 &&
                 kvedge_model_builtin(c->model_id, &(kvedge_model_t){0}) != KVEDGE_OK;
    for (uint32_t i = 0; rc == KVEDGE_OK && plain && i < kvedge_placed_count(r->pw); i++) {
        kvedge_client_t *node = kvedge_placed_client(r->pw, i);
        kvedge_model_t m = c->model;
        snprintf(m.id, sizeof m.id, "%s", c->model_id);
        int prc = node ? kvedge_client_put_model(node, &m) : KVEDGE_OK;
        if (prc != KVEDGE_OK && prc != KVEDGE_ESHAPE)
            rc = prc;
    }
    if (kvedge_placed_acked(r->pw) < kvedge_placed_quorum(r->pw)) {
        char text[2048];
        s_replicas_text(r, text, sizeof text);
        kvedge_cli_error("prefill: replicas: %s: fewer than W acknowledged every block", text);
        return KVEDGE_EXIT_FAILURE;
    }
    if (rc == KVEDGE_EINVAL) {
        kvedge_cli_error("prefill: the nodes or codec refused these settings (scheme %s, dtype %s, "
                         "group %u, keep-channels %u of %u): %s",
                         kvedge_scheme_name(r->q.scheme), kvedge_dtype_name(r->q.dtype),
                         r->q.group_size, r->q.keep_channels, c->cfg->head_dim,
                         kvedge_strerror(rc));
        return KVEDGE_EXIT_USAGE;
    }
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("prefill: %s (%s)", kvedge_strerror(rc), kvedge_errname(rc));
        return kvedge_cli_exit_code(rc) == KVEDGE_EXIT_USAGE ? KVEDGE_EXIT_FAILURE
                                                             : kvedge_cli_exit_code(rc);
    }
    r->n_ids = r->st.n_chunks ? r->st.n_chunks : r->n_ids;
    return KVEDGE_EXIT_OK;
}

static void s_prefill_json(const kvedge_cli_t *cli, const s_prefill_t *r, bool mapped_only)
{
    const kvedge_e2e_prefill_stats_t *st = &r->st;
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES];
    printf("{\"node\":");
    if (cli->host)
        kvedge_cli_json_str(stdout, cli->host);
    else
        printf("null");
    if (r->pw) {
        kvedge_placed_replica_t rep;
        printf(",\"replicas\":{\"asked\":%u,\"placed\":%u,\"acked\":%u,\"write_quorum\":%u,"
               "\"nodes\":[",
               kvedge_placed_asked(r->pw), kvedge_placed_count(r->pw), kvedge_placed_acked(r->pw),
               kvedge_placed_quorum(r->pw));
        for (uint32_t i = 0; i < kvedge_placed_count(r->pw); i++) {
            kvedge_placed_replica(r->pw, i, &rep);
            printf("%s{\"id\":", i ? "," : "");
            kvedge_cli_json_str(stdout, rep.id);
            printf(",\"endpoint\":");
            kvedge_cli_json_str(stdout, rep.endpoint);
            printf(",\"ok\":%s,\"error\":", rep.connected && !rep.status ? "true" : "false");
            if (rep.connected && !rep.status)
                printf("null");
            else
                kvedge_cli_json_str(stdout, kvedge_strerror(rep.status));
            printf("}");
        }
        printf("]}");
    }
    printf(",\"model\":");
    kvedge_cli_json_str(stdout, r->c.model.id);
    printf(",\"tokens\":%u,\"chunk_tokens\":%u,\"chunks\":[", r->c.ctx_len, r->ct);
    for (size_t i = 0; i < r->n_ids; i++)
        printf("%s\"%s\"", i ? "," : "", kvedge_chunk_id_hex(&r->ids[i], hex));
    printf("],\"scheme\":\"%s\",\"dtype\":\"%s\",\"blocks\":%llu,\"bytes\":%llu,"
           "\"fp16_bytes\":%llu,\"prefill_ms\":%.3f,\"encode_ms\":%.3f,"
           "\"put_ms\":%.3f",
           kvedge_scheme_name(r->q.scheme), kvedge_dtype_name(r->q.dtype),
           (unsigned long long)st->blocks, (unsigned long long)st->bytes,
           (unsigned long long)st->fp16_bytes, st->prefill_us / 1e3, st->encode_us / 1e3,
           st->put_us / 1e3);
    if (r->q.layers) {
        printf(",\"layers\":[");
        for (uint32_t l = 0, k = 0; l < r->c.cfg->layers; l++)
            if (kvedge_prune_set_has(r->q.layers, l))
                printf("%s%u", k++ ? "," : "", l);
        printf("],\"pruned_blocks\":%llu,\"pruned_bytes\":%llu,"
               "\"pruned_fp16_bytes\":%llu",
               (unsigned long long)st->pruned_blocks, (unsigned long long)st->pruned_bytes,
               (unsigned long long)st->pruned_fp16_bytes);
        if (mapped_only) {
            printf(",\"maps\":");
            kvedge_cli_json_str(stdout, r->edges);
        }
    }
    printf("}\n");
}

static void s_prefill_text(const kvedge_cli_t *cli, const s_prefill_t *r, bool mapped_only)
{
    const kvedge_e2e_prefill_stats_t *st = &r->st;
    const s_common_t *c = &r->c;
    char hex[KVEDGE_CHUNK_ID_HEX_BYTES], b1[32], b2[32];
    double ratio = st->bytes ? (double)st->fp16_bytes / (double)st->bytes : 0.0;
    printf("prefilled %u context tokens of %s (%u layers, %u KV heads of %u for %u query heads) "
           "on %s\n",
           c->ctx_len, c->model.id, c->cfg->layers, c->cfg->kv_heads, c->cfg->head_dim,
           c->cfg->heads, cli->host ? cli->host : "its placement");
    if (r->pw) {
        char text[2048];
        s_replicas_text(r, text, sizeof text);
        printf("replicas: %s\n", text);
    }
    printf("chunks: %zu of %u tokens, first %s\n", r->n_ids, r->ct,
           r->n_ids ? kvedge_chunk_id_hex(&r->ids[0], hex) : "-");
    printf("blocks: %llu (%s %s), %s stored for %s fp16: %.2fx%s\n", (unsigned long long)st->blocks,
           kvedge_scheme_name(r->q.scheme), kvedge_dtype_name(r->q.dtype),
           kvedge_cli_bytes(st->bytes, b1, sizeof b1),
           kvedge_cli_bytes(st->fp16_bytes, b2, sizeof b2), ratio, r->q.pin ? ", pinned" : "");
    if (r->q.layers) {
        char kept[KVEDGE_PRUNE_LIST_BYTES], b3[32];
        kvedge_prune_set_format(r->q.layers, kept, sizeof kept);
        uint64_t full = st->bytes + st->pruned_bytes;
        printf("layers: kept %s of %u (%s), pruned %u: saved %s of %s (%.1f%%), %llu "
               "blocks\n",
               kept, c->cfg->layers, mapped_only ? "mapped" : "--layers",
               c->cfg->layers - st->layers_put, kvedge_cli_bytes(st->pruned_bytes, b1, sizeof b1),
               kvedge_cli_bytes(full, b3, sizeof b3),
               full ? 100.0 * (double)st->pruned_bytes / (double)full : 0.0,
               (unsigned long long)st->pruned_blocks);
        if (mapped_only)
            printf("maps: %zu naming %s (edge models %s)\n", r->n_maps, c->model.id, r->edges);
    }
    printf("time: prefill %.1f ms, encode %.1f ms, put %.1f ms\n", st->prefill_us / 1e3,
           st->encode_us / 1e3, st->put_us / 1e3);
}

/* `prefill --engine llama.cpp`. Returns an exit code. */
static int s_prefill_llamacpp(kvedge_cli_t *cli, const s_prefill_opts_t *o)
{
    if (o->mapped_only || o->master || o->replicas || o->write_quorum) {
        kvedge_cli_error("prefill: --mapped-only is for --engine reference, and so is the "
                         "placement (--master, --replicas, --write-quorum)");
        return KVEDGE_EXIT_USAGE;
    }
    if (!cli->host) {
        kvedge_cli_error("prefill: needs -H NODE: the store node to put the context's K/V to");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_cli_llamacpp_args_t a;
    s_llamacpp_args("prefill", &o->c, &a);
    kvedge_e2e_quant_default(&a.quant);
    if (kvedge_scheme_parse(o->scheme, &a.quant.scheme) != KVEDGE_OK ||
        kvedge_dtype_parse(o->dtype, &a.quant.dtype) != KVEDGE_OK ||
        (a.quant.dtype != KVEDGE_DTYPE_FP16 && a.quant.dtype != KVEDGE_DTYPE_FP32)) {
        kvedge_cli_error("prefill: bad --scheme '%s' or --dtype '%s' (int8, int4 or lossless; "
                         "fp16 or fp32)",
                         o->scheme, o->dtype);
        return KVEDGE_EXIT_USAGE;
    }
    a.quant.group_size = (uint16_t)o->group;
    a.quant.keep_channels = (uint16_t)o->keep_channels;
    a.layers = o->layers;
    a.quant.pin = o->pin;
    a.quant.ttl_s = o->ttl_s;
#ifdef KVEDGE_HAVE_LLAMACPP
    return kvedge_cli_llamacpp_prefill(cli, &a);
#else
    return s_no_llamacpp("prefill");
#endif
}

static int s_prefill(kvedge_cli_t *cli, const void *opts)
{
    const s_prefill_opts_t *o = opts;
    int engine = s_engine("prefill", &o->c);
    if (engine)
        return engine < 0 ? KVEDGE_EXIT_USAGE : s_prefill_llamacpp(cli, o);
    s_prefill_t *r = calloc(1, sizeof *r);
    if (!r) {
        kvedge_cli_error("prefill: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    int ex = s_prefill_check(cli, o, r);
    bool placed = !cli->host;
    if (!ex && placed)
        ex = s_prefill_tier(cli, o, r);
    if (!ex)
        ex = s_common_load(&r->c);
    if (!ex)
        ex = s_prefill_layers(cli, o, r);
    if (!ex)
        ex = placed ? s_prefill_put_placed(cli, o, r) : s_prefill_put(cli, r);
    if (!ex && cli->json)
        s_prefill_json(cli, r, o->mapped_only);
    else if (!ex)
        s_prefill_text(cli, r, o->mapped_only);
    kvedge_placed_destroy(&r->pw);
    free(r->tier);
    free(r->ids);
    s_common_free(&r->c);
    free(r);
    return ex;
}

/* ---------------------------------------------------------------- decode */

/* What `kvedge decode` runs on. */
typedef struct {
    s_common_opts_t c;
    const char *prompt, *prompt_ids;
    uint32_t max_new;
    double penalty;
    bool plan_recompute, compare, quiet;
    const char *cloud_link, *adapter, *accept, *budget;
    const char *master, *master_pub, *master_key;
} s_decode_opts_t;

static const kvedge_cmdopt_t s_decode_list[] = {
    S_COMMON_LIST(s_decode_opts_t),
    {.name = "prompt",
     .arg = "TEXT",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, prompt),
     .help = "the user's prompt (through --tokenizer, else the byte tokenizer)"},
    {.name = "prompt-ids",
     .arg = "LIST",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, prompt_ids),
     .help = "the prompt as token ids"},
    {.name = "max-new",
     .arg = "N",
     .type = KVEDGE_CMDOPT_UINT,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, max_new),
     .min = 1,
     .max = UINT32_MAX,
     .def_num = S_MAX_NEW_DEFAULT,
     .help = "tokens to generate"},
    {.name = "repetition-penalty",
     .arg = "P",
     .type = KVEDGE_CMDOPT_DOUBLE,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, penalty),
     .dmin = 1.0,
     .dmax = 10.0,
     .def_double = 1.0,
     .help = "> 1: greedy picks divide the logits of tokens already in the prompt or generated "
             "by P (CTRL's penalty; 1: off)"},
    {.name = "plan-recompute",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, plan_recompute),
     .help = "send the decoder's time estimates: the proxy may plan layers to be computed here "
             "rather than fetched"},
    {.name = "compare",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, compare),
     .help = "also run edge-only (recompute everything here) and cloud-only (the prompt goes to "
             "a cloud model, emulated in this process with the context in its prefix cache: "
             "its prefill is not timed) and print TTFT, time and bytes side by side"},
    {.name = "cloud-link",
     .arg = "SPEC",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, cloud_link),
     .def = S_CLOUD_LINK_DEFAULT,
     .help = "cloud-only's link, RATE,LATENCY"},
    {.name = "quiet",
     .letter = 'q',
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, quiet),
     .help = "print only the generated tokens (and the comparison)"},
    {.name = "adapter",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, adapter),
     .help = "large-small (mode ce-lslm, docs/largesmall.md): the FETCH also names the cloud "
             "model of this adapter (`kvedge layermap --adapter FILE` writes one: its cloud id, "
             "layers, KV heads and head size) and the context's chunk ids under it; a layer the "
             "proxy serves from the cloud model (the layer map registered for the pair) is "
             "adapted here to this model's shape. Needs a proxy at -H; the adapter must fit "
             "--weights"},
    {.name = "master",
     .arg = "EPS",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, master),
     .help = "with --adapter: the Storage Master (its ROUTER, or a list EP[,EP...] of the "
             "masters of one cluster); the adapter is used only when it is the file registered "
             "for the pair (adapter/CLOUD/EDGE: digest and size) and was fitted with the map "
             "registered now; else, or with no record or no master in time, the decode goes "
             "on without it"},
    {.name = "master-pub",
     .arg = "PUBS",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, master_pub),
     .def_text = "for tcp://HOST:PORT, PORT+1",
     .help = "the master's PUB"},
    {.name = "master-key",
     .arg = "KEY",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, master_key),
     .help = "the master's public key or certificate (none: plaintext, loopback and ipc only; "
             "with the global --cert)"},
    {.name = "accept",
     .arg = "LIST",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, accept),
     .help = "the cache optimizer: the precisions this edge accepts, best first (lossless, "
             "int8, int4-g32/64/128, each +think-75 or +think-50, then +ec for the same values "
             "entropy-coded; tc, transform-coded, with the model's basis: --basis; "
             "docs/protocol.md "
             "\"Precisions\"); the proxy picks one per layer, a store node serves the first it "
             "holds or derives"},
    {.name = "budget",
     .arg = "M:V",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_decode_opts_t, budget),
     .help = "the quality budget the proxy plans under: ppl:PCT (perplexity increase, 0 to "
             "100) or kl:NATS (0 to 10), priced with the proxy's --quality profiles; needs "
             "--accept and a proxy"},
};

static const kvedge_cmdopts_t s_decode_opts = {
    .command = "decode",
    .summary = "Edge role: decode a prompt on the context's K/V fetched through a proxy.",
    .about =
        "Run as `kvedge -H PROXY [--server-key KEY --cert FILE] decode ...` (-H goes before\n"
        "the command). Give the shared context once (--file, --context or --context-ids) and\n"
        "the prompt once (--prompt or --prompt-ids).\n\n"
        "The edge role: asks the proxy at -H (or a store node) for the shared context's K/V,\n"
        "one FETCH with the context's chunk ids (computed here from the context), runs each\n"
        "decoder layer as soon as its K/V is resident, computes itself every layer that comes\n"
        "back as a miss, then decodes the prompt on top and generates greedily. The prompt "
        "never\n"
        "leaves this process. Prints each layer's source and reason, TTFT, total time and "
        "bytes,\n"
        "and the generated token ids and their text: with --tokenizer, the bytes of their "
        "tokens;\n"
        "without, as bytes of the byte tokenizer (bytes 32..126 as themselves, others as "
        "'.').\n\n"
        "--json prints one object: {\"kvedge\": RUN, \"edge_only\": RUN, \"cloud_only\": RUN "
        "(with\n"
        "--compare), \"tokens\": {MODE: [ids]}, \"text\": STRING (bytes that are not UTF-8 as\n"
        "U+FFFD), \"tokens_agree\": BOOL, ...}; with --adapter the kvedge RUN's mode is\n"
        "\"ce-lslm\", it names \"mapped_model\" and \"adapted\", and each layer its "
        "\"from_layer\"\n"
        "(the cloud layer that fed it, null when its own).\n\n"
        "An --adapter file that is read but refused (damaged or non-finite weights, another\n"
        "model pair, other rotary settings, other shapes than --weights) is reported on stderr\n"
        "and the decode goes on without it: the edge model's own layers, those no source holds\n"
        "computed here. With --master the same holds for a file that is not the one registered\n"
        "for the pair, one fitted with another map than the registered one, no registered\n"
        "adapter, and no snapshot from the master within the deadline (--deadline, else 3 s).\n\n"
        "exit codes: 2 usage (also a --tokenizer refused or whose ids do not fit the model,\n"
        "--adapter against a store node), 1 weights that do not load or a decode that failed (a\n"
        "layer failed rather than missed: a source past the deadline, the proxy gone), or an\n"
        "--adapter that cannot be read, 3 the proxy or node does not know the model, 5 proxy\n"
        "unreachable.\n",
    KVEDGE_CMDOPTS_OF(s_decode_opts_t, s_decode_list)};

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
    if (rc == KVEDGE_ENOBASIS) {
        kvedge_cli_error("decode: --accept lists tc, but no coding basis of model %s is loaded: "
                         "give its directory with --basis DIR, or drop tc from --accept",
                         c->model_id);
        return KVEDGE_EXIT_USAGE;
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
    int ex = s_text_ids("decode", "--prompt", c->tok, c->special, text, len, c->cfg->vocab, out, n);
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
                          kvedge_model_t *mapped, uint8_t *digest, uint64_t *size)
{
    char why[512];
    int rc = kvedge_adapter_load_digest(path, out, digest, size, why, sizeof why);
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
        kvedge_cli_error(
            "decode: the adapter %s does not fit %s (%u layers, %u KV heads of %u)%s%s", path,
            c->weights, c->cfg->layers, c->cfg->kv_heads, c->cfg->head_dim, why[0] ? ": " : "",
            why);
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

enum { S_RUNS = 3 };
static const kvedge_e2e_mode_t s_modes[S_RUNS] = {KVEDGE_E2E_KVEDGE, KVEDGE_E2E_LOCAL,
                                                  KVEDGE_E2E_CLOUD_ONLY};
static const char *const s_run_keys[S_RUNS] = {"kvedge", "edge_only", "cloud_only"};

/* What decode works on and what its runs made. */
typedef struct {
    s_common_t c;
    kvedge_prec_t accept[KVEDGE_PREC_MAX_ACCEPT];
    size_t n_accept;
    kvedge_quality_metric_t metric;
    double budget;
    kvedge_adapter_t *adapter;                  /* --adapter, or NULL */
    kvedge_model_t mapped;                      /* the adapter's cloud model */
    uint8_t digest[KVEDGE_MASTER_DIGEST_BYTES]; /* the adapter file's */
    uint64_t size;
    int32_t *prompt;
    uint32_t prompt_len;
    int runs;                 /* 1, or S_RUNS with --compare */
    kvedge_e2e_result_t *res; /* [S_RUNS]: about 100 KiB each, on the heap */
    int32_t *tok[S_RUNS];     /* [max_new] each */
} s_decode_t;

static void s_decode_free(s_decode_t *r)
{
    for (int i = 0; i < S_RUNS; i++)
        free(r->tok[i]);
    free(r->res);
    free(r->prompt);
    kvedge_adapter_destroy(&r->adapter);
    s_common_free(&r->c);
}

/* The values the table cannot check (--cloud-link, --accept, --budget), then which flags go
 * together. Returns an exit code. */
static int s_decode_check(const kvedge_cli_t *cli, const s_decode_opts_t *o, s_decode_t *r)
{
    uint64_t rate;
    uint32_t lat;
    const char *flag = NULL, *val = NULL, *hint = "";
    int ex = s_common_from(&r->c, "decode", &o->c);
    if (ex)
        return ex;
    if (kvedge_shaper_parse(o->cloud_link, &rate, &lat) != KVEDGE_OK)
        flag = "cloud-link", val = o->cloud_link, hint = " (RATE,LATENCY such as 1gbit,10ms)";
    else if (o->accept && kvedge_prec_list_parse(o->accept, r->accept, KVEDGE_PREC_MAX_ACCEPT,
                                                 &r->n_accept) != KVEDGE_OK)
        flag = "accept", val = o->accept,
        hint = " (1 to 8 distinct precisions, best first, such as "
               "int8,int4-g32,int4-g32+think-50)";
    else if (o->budget &&
             kvedge_quality_budget_parse(o->budget, &r->metric, &r->budget) != KVEDGE_OK)
        flag = "budget", val = o->budget, hint = " (ppl:PCT (0 to 100) or kl:NATS (0 to 10))";
    if (flag) {
        kvedge_cli_error("decode: bad value '%s' for --%s%s", val, flag, hint);
        return KVEDGE_EXIT_USAGE;
    }
    if (!cli->host) {
        kvedge_cli_error("decode: needs -H PROXY: the edge proxy (or a store node) to fetch the "
                         "context's K/V from");
        return KVEDGE_EXIT_USAGE;
    }
    if (!o->prompt == !o->prompt_ids) {
        kvedge_cli_error("decode: give the prompt once: --prompt TEXT or --prompt-ids LIST");
        return KVEDGE_EXIT_USAGE;
    }
    if (r->metric != KVEDGE_QUALITY_NONE && !r->n_accept) {
        kvedge_cli_error("decode: --budget needs --accept: the precisions it may choose among");
        return KVEDGE_EXIT_USAGE;
    }
    if ((o->master && !o->adapter) || (!o->master && (o->master_pub || o->master_key))) {
        kvedge_cli_error("decode: --master goes with --adapter (the master holding the pair's "
                         "registered adapter), --master-pub and --master-key with --master");
        return KVEDGE_EXIT_USAGE;
    }
    return KVEDGE_EXIT_OK;
}

/* --adapter with --master: whether the file is the pair's registered adapter, fitted with the
 * map registered now (kvedge_adapter_check_registered on snapshots of adapter/CLOUD/EDGE and
 * map/CLOUD/EDGE). Returns an exit code: 0 use it; 2 flags that cannot work; any other, said
 * why: go on without it. */
static int s_adapter_registered(const kvedge_cli_t *cli, const s_decode_opts_t *o, s_decode_t *r)
{
    const kvedge_adapter_info_t *ai = kvedge_adapter_info(r->adapter);
    const s_master_t ms = {o->master, o->master_pub, o->master_key, cli->cert,
                           cli->deadline_ms > 0 ? cli->deadline_ms : KVEDGE_MVIEW_SNAPSHOT_MS};
    const kvedge_master_space_t sp[2] = {KVEDGE_MASTER_SPACE_ADAPTER, KVEDGE_MASTER_SPACE_MAP};
    kvedge_master_adapter_t *rec = malloc(sizeof *rec);
    kvedge_master_map_t *map = malloc(sizeof *map);
    bool have[2] = {false, false};
    int ex = rec && map ? KVEDGE_EXIT_OK : KVEDGE_EXIT_FAILURE;
    for (int i = 0; !ex && i < 2; i++) {
        char key[KVEDGE_KVMSG_MAX_KEY_BYTES + 1];
        kvedge_mview_t *v = NULL;
        if (kvedge_master_key_format(sp[i], ai->cloud_id, ai->edge_id, key, sizeof key) !=
            KVEDGE_OK) {
            kvedge_cli_error("decode: the adapter's ids %s and %s are not registry model ids: no "
                             "record can name them",
                             ai->cloud_id, ai->edge_id);
            ex = KVEDGE_EXIT_NOTFOUND;
            break;
        }
        ex = s_master_view("decode", &ms, key, "the adapter cannot be checked", &v);
        int rc = ex  ? KVEDGE_OK
                 : i ? kvedge_mview_map(v, ai->cloud_id, ai->edge_id, map)
                     : kvedge_mview_adapter(v, ai->cloud_id, ai->edge_id, rec);
        have[i] = !ex && rc == KVEDGE_OK;
        if (!ex && rc != KVEDGE_OK && rc != KVEDGE_ENOTFOUND) {
            kvedge_cli_error("decode: the master's %s does not parse: %s", key,
                             kvedge_strerror(rc));
            ex = KVEDGE_EXIT_CORRUPT;
        }
        kvedge_mview_destroy(&v);
    }
    char why[KVEDGE_ADAPTER_REG_WHY_BYTES] = "";
    if (!ex &&
        kvedge_adapter_check_registered(r->adapter, r->digest, r->size, have[0] ? rec : NULL,
                                        have[1] ? map : NULL, why, sizeof why) != KVEDGE_OK) {
        kvedge_cli_error("decode: %s: %s", o->adapter, why);
        ex = KVEDGE_EXIT_CORRUPT;
    } else if (!ex) {
        fprintf(stderr, "kvedge: decode: %s is the adapter registered for %s -> %s at %s (%s)\n",
                o->adapter, ai->cloud_id, ai->edge_id, o->master, kvedge_master_fit_name(rec->fit));
    }
    free(rec);
    free(map);
    return ex;
}

/* Loads the weights, the context, the adapter and the prompt, and makes room for the runs'
 * results. Returns an exit code. */
static int s_decode_prepare(const kvedge_cli_t *cli, const s_decode_opts_t *o, s_decode_t *r)
{
    int ex = s_common_load(&r->c);
    if (!ex && o->adapter) {
        /* A file that cannot be read fails the command; one that is read and refused (damaged
         * or non-finite weights, another model pair, other rotary settings or shapes) costs
         * only the large-small mode: the request goes on as the edge model's own, and the
         * layers no source holds of it are computed here. s_load_adapter said why. */
        int aex = s_load_adapter(&r->c, o->adapter, &r->adapter, &r->mapped, r->digest, &r->size);
        /* With a master, only the registered file, fitted with the registered map: a file
         * that cannot be checked is not used either. */
        int rex = !aex && o->master ? s_adapter_registered(cli, o, r) : KVEDGE_EXIT_OK;
        if (rex == KVEDGE_EXIT_USAGE || aex == KVEDGE_EXIT_FAILURE) {
            ex = rex == KVEDGE_EXIT_USAGE ? rex : aex;
        } else if (aex != KVEDGE_EXIT_OK || rex != KVEDGE_EXIT_OK) {
            kvedge_adapter_destroy(&r->adapter);
            memset(&r->mapped, 0, sizeof r->mapped);
            kvedge_cli_error("decode: going on without the adapter: the edge computes the "
                             "layers no source holds of %s",
                             r->c.model.id);
        }
    }
    if (!ex)
        ex = s_prompt(&r->c, o->prompt, o->prompt_ids, &r->prompt, &r->prompt_len);
    if (!ex && (uint64_t)r->c.ctx_len + r->prompt_len + o->max_new > r->c.cfg->max_positions) {
        kvedge_cli_error("decode: context (%u) + prompt (%u) + --max-new (%llu) tokens exceed the "
                         "model's %u positions",
                         r->c.ctx_len, r->prompt_len, (unsigned long long)o->max_new,
                         r->c.cfg->max_positions);
        ex = KVEDGE_EXIT_USAGE;
    }
    if (ex)
        return ex;
    r->runs = o->compare ? S_RUNS : 1;
    r->res = calloc(S_RUNS, sizeof *r->res);
    bool oom = !r->res;
    for (int i = 0; i < r->runs; i++)
        oom = oom || !(r->tok[i] = calloc(o->max_new, sizeof *r->tok[i]));
    if (oom) {
        kvedge_cli_error("decode: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

/* Connects to -H. A store node streams whatever it holds and a model it does not know would
 * read as "every layer missed": ask it first (a proxy refuses an unknown model itself).
 * Returns an exit code. */
static int s_decode_connect(kvedge_cli_t *cli, s_decode_t *r, kvedge_client_t **proxy)
{
    int ex = kvedge_cli_connect(cli, "kvedge decode", proxy);
    const kvedge_node_info_t *peer = ex ? NULL : kvedge_client_node(*proxy);
    if (peer && peer->role != KVEDGE_ROLE_PROXY && r->adapter) {
        kvedge_cli_error("decode: --adapter needs an edge proxy at -H (%s is a store node: only a "
                         "proxy serves another model's layers)",
                         cli->host);
        ex = KVEDGE_EXIT_USAGE;
    } else if (peer && peer->role != KVEDGE_ROLE_PROXY) {
        kvedge_model_t known;
        int rc = kvedge_client_get_model(*proxy, r->c.model.id, &known);
        if (rc == KVEDGE_OK &&
            (known.layers != r->c.model.layers || known.kv_heads != r->c.model.kv_heads ||
             known.head_dim != r->c.model.head_dim))
            rc = KVEDGE_ESHAPE;
        bool builtin = kvedge_model_builtin(r->c.model_id, &(kvedge_model_t){0}) == KVEDGE_OK;
        if (rc == KVEDGE_ENOMODEL && strcmp(r->c.model.id, r->c.model_id) != 0 && !builtin &&
            kvedge_client_get_model(*proxy, r->c.model_id, &known) == KVEDGE_OK) {
            kvedge_cli_error("decode: the context of model '%s' on %s was prefilled by a model "
                             "with other rotary settings than %s (rope_theta or rope_scaling; "
                             "this one's K is stored as '%s'): its K does not fit this model. "
                             "Decode with the weights it was prefilled with",
                             r->c.model_id, cli->host, r->c.weights, r->c.model.id);
            return KVEDGE_EXIT_USAGE;
        }
        if (rc != KVEDGE_OK)
            ex = s_remote_fail(&r->c, cli, rc);
    }
    return ex;
}

/* One run's request: kvedge through the proxy, or a baseline. */
static kvedge_e2e_request_t s_decode_request(const kvedge_cli_t *cli, const s_decode_opts_t *o,
                                             s_decode_t *r, kvedge_e2e_mode_t mode,
                                             kvedge_client_t *proxy)
{
    kvedge_e2e_request_t req = {.mode = mode,
                                .decoder = r->c.d,
                                .ctx = r->c.ctx,
                                .ctx_len = r->c.ctx_len,
                                .prompt = r->prompt,
                                .prompt_len = r->prompt_len,
                                .max_new = o->max_new,
                                .repetition_penalty = (float)o->penalty,
                                .chunk_tokens = (uint32_t)r->c.chunk_tokens,
                                .deadline_ms = cli->deadline_ms};
    if (mode == KVEDGE_E2E_KVEDGE) {
        req.proxy = proxy;
        req.model = &r->c.model;
        req.plan_recompute = o->plan_recompute;
        req.mapped_model = r->adapter ? &r->mapped : NULL;
        req.adapter = r->adapter;
        req.accept = r->n_accept ? r->accept : NULL;
        req.n_accept = r->n_accept;
        req.quality_metric = r->metric;
        req.quality_budget = r->budget;
    }
    return req;
}

/* The runs: kvedge through the proxy at -H, then (--compare) edge-only and cloud-only.
 * Returns an exit code. */
static int s_decode_runs(kvedge_cli_t *cli, const s_decode_opts_t *o, s_decode_t *r)
{
    kvedge_client_t *proxy = NULL;
    kvedge_e2e_cloud_t *cloud = NULL;
    int ex = s_decode_connect(cli, r, &proxy);
    for (int i = 0; !ex && i < r->runs; i++) {
        kvedge_e2e_request_t req = s_decode_request(cli, o, r, s_modes[i], proxy);
        if (s_modes[i] == KVEDGE_E2E_CLOUD_ONLY) {
            /* The emulated cloud prefills the context here, outside any request's time. */
            int rc = kvedge_e2e_cloud_new(r->c.d, r->c.ctx, r->c.ctx_len, o->cloud_link, &cloud);
            if (rc != KVEDGE_OK) {
                kvedge_cli_error("decode: cannot start the emulated cloud model (link %s): %s",
                                 o->cloud_link, kvedge_strerror(rc));
                ex = KVEDGE_EXIT_FAILURE;
                break;
            }
            req.cloud = cloud;
        }
        int rc = kvedge_e2e_decode(&req, r->tok[i], &r->res[i]);
        if (rc != KVEDGE_OK)
            ex = s_decode_fail(&r->c, cli, s_modes[i], r->prompt_len, o->max_new, rc);
        if (i == 0) /* the proxy is needed for the kvedge run only */
            kvedge_client_destroy(&proxy);
    }
    kvedge_client_destroy(&proxy);
    kvedge_e2e_cloud_destroy(&cloud);
    return ex;
}

static void s_decode_json(const s_decode_opts_t *o, const s_decode_t *r, const char *text,
                          size_t text_len)
{
    uint32_t n = o->max_new, diff = s_agree(r->tok, r->runs, n);
    printf("{");
    for (int i = 0; i < r->runs; i++) {
        printf("%s\"%s\":", i ? "," : "", s_run_keys[i]);
        s_print_run_json(&r->res[i]);
    }
    printf(",\"model\":");
    kvedge_cli_json_str(stdout, r->c.model_id);
    printf(",\"context_tokens\":%u,\"prompt_tokens\":%u,\"tokens\":{", r->c.ctx_len, r->prompt_len);
    for (int i = 0; i < r->runs; i++) {
        printf("%s\"%s\":[", i ? "," : "", s_run_keys[i]);
        s_print_ids(stdout, r->tok[i], n, ",");
        printf("]");
    }
    printf("},\"text\":");
    if (text)
        kvedge_e2e_json_text(stdout, text, text_len);
    else
        printf("null");
    if (o->compare) {
        double k = r->res[0].ttft_us > 0 ? r->res[0].ttft_us : 1;
        printf(",\"tokens_agree\":%s,\"first_token_agrees\":%s,"
               "\"ttft_edge_only_over_kvedge\":%.3f,"
               "\"ttft_cloud_only_over_kvedge\":%.3f,\"cloud_link\":",
               diff == n ? "true" : "false", diff > 0 ? "true" : "false", r->res[1].ttft_us / k,
               r->res[2].ttft_us / k);
        kvedge_cli_json_str(stdout, o->cloud_link);
    }
    printf("}\n");
}

/* --compare's table of the three runs and whether their tokens agree. */
static void s_decode_compare(const s_decode_opts_t *o, const s_decode_t *r)
{
    uint32_t n = o->max_new, diff = s_agree(r->tok, r->runs, n);
    const kvedge_e2e_result_t *res = r->res;
    char b[4][32];
    printf("\n%-11s %10s %10s %11s %11s %11s\n", "MODE", "TTFT ms", "TOTAL ms", "SENT", "RECEIVED",
           "PROMPT UP");
    for (int i = 0; i < r->runs; i++)
        printf("%-11s %10.2f %10.2f %11s %11s %11s\n", kvedge_e2e_result_mode(&res[i]),
               res[i].ttft_us / 1e3, res[i].total_us / 1e3,
               kvedge_cli_bytes(res[i].sent_bytes, b[0], 32),
               kvedge_cli_bytes(res[i].received_bytes, b[1], 32),
               kvedge_cli_bytes(res[i].prompt_bytes_sent, b[2], 32));
    double k = res[0].ttft_us > 0 ? res[0].ttft_us : 1;
    const char *mine = kvedge_e2e_result_mode(&res[0]); /* kvedge or ce-lslm */
    printf("TTFT edge-only / %s: %.2fx, cloud-only / %s: %.2fx (cloud link "
           "%s; the cloud's prefill of the context is not timed)\n",
           mine, res[1].ttft_us / k, mine, res[2].ttft_us / k, o->cloud_link);
    if (diff == n)
        printf("tokens agree: yes (all %u equal in the three modes)\n", n);
    else
        printf("tokens agree: no (first difference at token %u: K/V stored "
               "quantized or in fp16 may change greedy picks)\n",
               diff);
}

static void s_decode_text(const kvedge_cli_t *cli, const s_decode_opts_t *o, const s_decode_t *r,
                          const char *text, size_t text_len)
{
    if (!o->quiet)
        for (int i = 0; i < r->runs; i++) {
            if (o->compare)
                printf("== %s\n", kvedge_e2e_result_mode(&r->res[i]));
            kvedge_e2e_print(stdout, &r->res[i], false);
        }
    if (!o->quiet && r->res[0].fetched == 0)
        printf("note: no layer came from %s: was the context prefilled there with the "
               "same tokens, --model-id and --chunk-tokens?\n",
               cli->host);
    printf("generated %u tokens: ", o->max_new);
    s_print_ids(stdout, r->tok[0], o->max_new, " ");
    if (text) {
        printf("\ntext: \"");
        fwrite(text, 1, text_len, stdout);
        printf("\"\n");
    } else {
        printf("\n");
    }
    if (o->compare)
        s_decode_compare(o, r);
}

/* `decode --engine llama.cpp`. Returns an exit code. */
static int s_decode_llamacpp(kvedge_cli_t *cli, const s_decode_opts_t *o)
{
    if (o->plan_recompute || o->compare || o->adapter || o->accept || o->budget || o->master ||
        o->penalty != 1.0) {
        kvedge_cli_error("decode: --plan-recompute, --compare, --adapter, --accept, --budget and "
                         "--repetition-penalty are for --engine reference");
        return KVEDGE_EXIT_USAGE;
    }
    if (!cli->host) {
        kvedge_cli_error("decode: needs -H PROXY: the edge proxy (or a store node) to fetch the "
                         "context's K/V from");
        return KVEDGE_EXIT_USAGE;
    }
    if (!o->prompt == !o->prompt_ids) {
        kvedge_cli_error("decode: give the prompt once: --prompt TEXT or --prompt-ids LIST");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_cli_llamacpp_args_t a;
    s_llamacpp_args("decode", &o->c, &a);
    a.prompt = o->prompt;
    a.prompt_ids = o->prompt_ids;
    a.max_new = o->max_new;
    a.quiet = o->quiet;
#ifdef KVEDGE_HAVE_LLAMACPP
    return kvedge_cli_llamacpp_decode(cli, &a);
#else
    return s_no_llamacpp("decode");
#endif
}

static int s_decode(kvedge_cli_t *cli, const void *opts)
{
    const s_decode_opts_t *o = opts;
    int engine = s_engine("decode", &o->c);
    if (engine)
        return engine < 0 ? KVEDGE_EXIT_USAGE : s_decode_llamacpp(cli, o);
    s_decode_t r = {0};
    int ex = s_decode_check(cli, o, &r);
    if (!ex)
        ex = s_decode_prepare(cli, o, &r);
    if (!ex)
        ex = s_decode_runs(cli, o, &r);
    if (!ex) {
        size_t text_len = 0;
        char *text = s_gen_text(&r.c, r.tok[0], o->max_new, &text_len);
        if (cli->json)
            s_decode_json(o, &r, text, text_len);
        else
            s_decode_text(cli, o, &r, text, text_len);
        free(text);
    }
    s_decode_free(&r);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_e2e_cmds[] = {
    {.name = "model-synth", .opts = &s_synth_opts, .exec = s_synth},
    {.name = "prefill", .opts = &s_prefill_opts, .exec = s_prefill},
    {.name = "decode", .opts = &s_decode_opts, .exec = s_decode},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
