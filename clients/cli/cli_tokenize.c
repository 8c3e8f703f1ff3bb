/* `kvedge tokenize`: text to token ids, or ids back to text (--decode), with the byte-level BPE
 * tokenizer (clients/decoder/tokenizer.h) of a vocab.json + merges.txt pair, a tokenizer.json or
 * a folder holding either. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "clients/cli/cli.h"
#include "clients/decoder/tokenizer.h"
#include "clients/e2e/e2e.h"
#include "access/codec/error.h"

/* What `kvedge tokenize` runs on. */
typedef struct {
    const char *vocab, *merges, *tokenizer; /* the tokenizer: vocab + merges, or one path */
    const char *file;                       /* the input; NULL = stdin */
    bool decode;                            /* ids to text */
    const char *add_bos;                    /* --add-bos: auto, yes or no */
    bool special;                           /* special tokens written in the text are ids */
} s_opts_t;

static const kvedge_cmdopt_t s_opt_list[] = {
    {.name = "vocab",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, vocab),
     .help = "vocab.json (GPT-2's encoder.json)"},
    {.name = "merges",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, merges),
     .help = "merges.txt (GPT-2's vocab.bpe)"},
    {.name = "tokenizer",
     .arg = "PATH",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, tokenizer),
     .help = "a tokenizer.json, or a folder with vocab.json + merges.txt (else tokenizer.json)"},
    {.name = "file",
     .arg = "FILE",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, file),
     .help = "read the text (or the ids) from FILE; default stdin"},
    {.name = "decode",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_opts_t, decode),
     .help = "ids to text"},
    {.name = "add-bos",
     .arg = "auto|yes|no",
     .type = KVEDGE_CMDOPT_STR,
     KVEDGE_CMDOPT_AT(s_opts_t, add_bos),
     .help = "the tokenizer.json template's tokens around the text (Llama 3's BOS); auto "
             "(default): when it has them"},
    {.name = "special",
     .type = KVEDGE_CMDOPT_BOOL,
     KVEDGE_CMDOPT_AT(s_opts_t, special),
     .help = "special tokens written in the text (<|begin_of_text|>, <s>) are their ids; "
             "without it they are text"},
};

static const char s_about[] =
    "Text to token ids (printed separated by spaces, then a newline), or with --decode ids\n"
    "(separated by spaces, commas or newlines) back to the text, printed as its exact bytes.\n"
    "Byte-level BPE as GPT-2 and OPT (vocab.json + merges.txt) and Llama 3 and Qwen2\n"
    "(tokenizer.json) tokenize (docs/decoder.md, \"Tokenizer\"). Give the tokenizer once:\n"
    "--vocab with --merges, or --tokenizer. A tokenizer.json whose template adds a BOS\n"
    "(Llama 3, the Llama pair of models/kjv/llama) puts it first unless --add-bos no, as\n"
    "prefill and decode do.\n\n"
    "--json prints {\"ids\": [...], \"count\": N} or {\"text\": \"...\", \"bytes\": N} (bytes that "
    "are\n"
    "not UTF-8 as U+FFFD).\n\n"
    "exit codes: 2 usage, a tokenizer file that is refused (the message names the file and\n"
    "the line, key or byte), ids that are not the tokenizer's; 1 a file that cannot be read.\n";

static const kvedge_cmdopts_t s_opts = {
    .command = "tokenize",
    .summary = "Text to token ids, or ids back to text, with a byte-level BPE (GPT-2, OPT, "
               "Llama 3, Qwen2).",
    .about = s_about,
    KVEDGE_CMDOPTS_OF(s_opts_t, s_opt_list)};

/* What it made: ids (encode, or the ids read to decode) and text (the input, or decoded). */
typedef struct {
    kvedge_tokenizer_t *t;
    char *input;
    size_t input_len;
    int32_t *ids;
    size_t n;
    char *text;
    size_t len;
} s_result_t;

/* Reads all of f into a new NUL-terminated buffer. Returns 0 or -1 (errno set). */
static int s_slurp(FILE *f, char **out, size_t *len)
{
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    if (!buf)
        return -1;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = cap < SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                errno = ENOMEM;
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (ferror(f)) {
        int e = errno;
        free(buf);
        errno = e ? e : EIO;
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

/* Loads the tokenizer the flags name; prints why and returns an exit code on failure. */
static int s_load(const char *vocab, const char *merges, const char *path, kvedge_tokenizer_t **t)
{
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    int rc = path ? kvedge_tokenizer_load_path(path, t, why, sizeof why)
                  : kvedge_tokenizer_load(vocab, merges, t, why, sizeof why);
    if (rc == KVEDGE_OK)
        return KVEDGE_EXIT_OK;
    kvedge_cli_error("tokenize: cannot load the tokenizer: %s", why);
    return rc == KVEDGE_EIO || rc == KVEDGE_ENOMEM ? KVEDGE_EXIT_FAILURE : KVEDGE_EXIT_USAGE;
}

/* Ids of text separated by whitespace or commas, each one of t's. Returns an exit code. */
static int s_parse_ids(const kvedge_tokenizer_t *t, const char *src, const char *text,
                       int32_t **out, size_t *n)
{
    size_t cap = 64, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    const char *p = text;
    size_t line = 1;
    while (ids) {
        while (*p && (isspace((unsigned char)*p) || *p == ','))
            line += *p++ == '\n';
        if (!*p)
            break;
        const char *start = p;
        while (*p && !isspace((unsigned char)*p) && *p != ',')
            p++;
        char num[16] = "";
        uint64_t v;
        size_t len = (size_t)(p - start);
        if (len < sizeof num)
            memcpy(num, start, len);
        char *txt = NULL;
        size_t tl;
        int32_t id = -1;
        bool ok = num[0] && kvedge_cli_parse_u64(num, 0, INT32_MAX, &v) == 0;
        if (ok) {
            id = (int32_t)v;
            ok = kvedge_tokenizer_decode(t, &id, 1, &txt, &tl) == KVEDGE_OK;
            free(txt);
        }
        if (!ok) {
            kvedge_cli_error("tokenize: %s:%zu: '%.*s' (id number %zu) is not a token id of this "
                             "tokenizer (0..%u)",
                             src, line, (int)(len < 32 ? len : 32), start, k + 1,
                             kvedge_tokenizer_vocab_size(t) - 1);
            free(ids);
            return KVEDGE_EXIT_USAGE;
        }
        if (k == cap) {
            int32_t *nb = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!nb)
                free(ids);
            ids = nb;
            if (!ids)
                break;
        }
        ids[k++] = id;
    }
    if (!ids) {
        kvedge_cli_error("tokenize: out of memory");
        return KVEDGE_EXIT_FAILURE;
    }
    *out = ids;
    *n = k;
    return KVEDGE_EXIT_OK;
}

/* Loads the tokenizer, reads the input and encodes or decodes it into r. Returns an exit
 * code, the reason printed. */
static int s_run(const s_opts_t *o, s_result_t *r)
{
    if (!o->tokenizer == !(o->vocab || o->merges) || (!o->tokenizer && (!o->vocab || !o->merges))) {
        kvedge_cli_error("tokenize: give the tokenizer once: --vocab FILE with --merges FILE, or "
                         "--tokenizer PATH");
        return KVEDGE_EXIT_USAGE;
    }
    bool yes = o->add_bos && strcmp(o->add_bos, "yes") == 0,
         no = o->add_bos && strcmp(o->add_bos, "no") == 0;
    if (o->add_bos && !yes && !no && strcmp(o->add_bos, "auto") != 0) {
        kvedge_cli_error("tokenize: bad value '%s' for --add-bos (auto, yes or no)", o->add_bos);
        return KVEDGE_EXIT_USAGE;
    }
    if (o->decode && (o->add_bos || o->special)) {
        kvedge_cli_error("tokenize: --%s is for encoding; --decode turns every id back into its "
                         "text, special ones included",
                         o->special ? "special" : "add-bos");
        return KVEDGE_EXIT_USAGE;
    }
    int ex = s_load(o->vocab, o->merges, o->tokenizer, &r->t);
    if (ex)
        return ex;
    bool tmpl = kvedge_tokenizer_bos_id(r->t) >= 0 || kvedge_tokenizer_eos_id(r->t) >= 0;
    if (yes && kvedge_tokenizer_bos_id(r->t) < 0) {
        kvedge_cli_error("tokenize: --add-bos yes, but the tokenizer %s adds no BOS token (its "
                         "template has none)",
                         o->tokenizer ? o->tokenizer : o->vocab);
        return KVEDGE_EXIT_USAGE;
    }
    const char *src = o->file ? o->file : "stdin";
    FILE *in = o->file ? fopen(o->file, "rb") : stdin;
    if (!in || s_slurp(in, &r->input, &r->input_len) != 0) {
        kvedge_cli_error("tokenize: cannot read %s: %s", src, strerror(errno));
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (in && in != stdin)
        fclose(in);
    if (ex)
        return ex;
    if (o->decode) {
        ex = s_parse_ids(r->t, src, r->input, &r->ids, &r->n);
        if (!ex && kvedge_tokenizer_decode(r->t, r->ids, r->n, &r->text, &r->len) != KVEDGE_OK) {
            kvedge_cli_error("tokenize: out of memory");
            ex = KVEDGE_EXIT_FAILURE;
        }
        return ex;
    }
    unsigned flags = (o->special ? KVEDGE_TOKENIZER_SPECIAL : 0u) |
                     (tmpl && !no ? KVEDGE_TOKENIZER_TEMPLATE : 0u);
    int rc = kvedge_tokenizer_encode_ex(r->t, r->input, r->input_len, flags, &r->ids, &r->n);
    if (rc != KVEDGE_OK) {
        kvedge_cli_error("tokenize: cannot encode %s: %s", src, kvedge_strerror(rc));
        return KVEDGE_EXIT_FAILURE;
    }
    return KVEDGE_EXIT_OK;
}

static void s_print(const kvedge_cli_t *cli, const s_opts_t *o, const s_result_t *r)
{
    if (o->decode && cli->json) {
        printf("{\"text\":");
        kvedge_e2e_json_text(stdout, r->text, r->len);
        printf(",\"bytes\":%zu}\n", r->len);
    } else if (o->decode) {
        fwrite(r->text, 1, r->len, stdout);
    } else {
        if (cli->json)
            fputs("{\"ids\":[", stdout);
        for (size_t i = 0; i < r->n; i++)
            printf("%s%d", i ? (cli->json ? "," : " ") : "", r->ids[i]);
        if (cli->json)
            printf("],\"count\":%zu}", r->n);
        printf("\n");
    }
}

static int s_tokenize(kvedge_cli_t *cli, const void *opts)
{
    const s_opts_t *o = opts;
    s_result_t r = {0};
    int ex = s_run(o, &r);
    if (!ex)
        s_print(cli, o, &r);
    if (!ex && (fflush(stdout) != 0 || ferror(stdout))) {
        kvedge_cli_error("tokenize: cannot write the output: %s", strerror(errno));
        ex = KVEDGE_EXIT_FAILURE;
    }
    free(r.ids);
    free(r.text);
    free(r.input);
    kvedge_tokenizer_destroy(&r.t);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_tokenize_cmds[] = {
    {.name = "tokenize", .opts = &s_opts, .exec = s_tokenize},
    {NULL, NULL, NULL, NULL, NULL, NULL, NULL},
};
