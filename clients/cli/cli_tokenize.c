/* `kvedge tokenize`: text to token ids, or ids back to text (--decode), with the byte-level BPE
 * tokenizer (clients/decoder/tokenizer.h) of a vocab.json + merges.txt pair, a tokenizer.json or
 * a folder holding either. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clients/cli/cli.h"
#include "clients/decoder/tokenizer.h"
#include "clients/e2e/e2e.h"
#include "access/codec/error.h"

enum {
    S_O_VOCAB = 1000,
    S_O_MERGES,
    S_O_TOKENIZER,
    S_O_FILE,
    S_O_DECODE,
};

static const char s_help[] =
    "Text to token ids (printed separated by spaces, then a newline), or with --decode ids\n"
    "(separated by spaces, commas or newlines) back to the text, printed as its exact bytes.\n"
    "GPT-2's byte-level BPE, as GPT-2, OPT and RoBERTa tokenize (docs/decoder.md, "
    "\"Tokenizer\").\n\n"
    "      --vocab FILE       vocab.json (GPT-2's encoder.json)\n"
    "      --merges FILE      merges.txt (GPT-2's vocab.bpe)\n"
    "      --tokenizer PATH   a tokenizer.json, or a folder with vocab.json + merges.txt\n"
    "                         (else tokenizer.json)\n"
    "      --file FILE        read the text (or the ids) from FILE; default stdin\n"
    "      --decode           ids to text\n\n"
    "--json prints {\"ids\": [...], \"count\": N} or {\"text\": \"...\", \"bytes\": N} (bytes that "
    "are\n"
    "not UTF-8 as U+FFFD).\n\n"
    "exit codes: 2 usage, a tokenizer file that is refused (the message names the file and\n"
    "the line, key or byte), ids that are not the tokenizer's; 1 a file that cannot be read.\n";

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
    int rc;
    struct stat st;
    if (path && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        rc = kvedge_tokenizer_load_dir(path, t, why, sizeof why);
    else if (path)
        rc = kvedge_tokenizer_load_json(path, t, why, sizeof why);
    else
        rc = kvedge_tokenizer_load(vocab, merges, t, why, sizeof why);
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

static int s_cmd_tokenize(kvedge_cli_t *cli, int argc, char **argv)
{
    static const struct option opts[] = {{"vocab", required_argument, NULL, S_O_VOCAB},
                                         {"merges", required_argument, NULL, S_O_MERGES},
                                         {"tokenizer", required_argument, NULL, S_O_TOKENIZER},
                                         {"file", required_argument, NULL, S_O_FILE},
                                         {"decode", no_argument, NULL, S_O_DECODE},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const kvedge_cli_cmd_t cmd = {"tokenize", NULL,
                                  "(--vocab FILE --merges FILE | --tokenizer PATH) [--file FILE] "
                                  "[--decode]",
                                  "Text to token ids, or ids to text, with a byte-level BPE."};
    const char *vocab = NULL, *merges = NULL, *path = NULL, *file = NULL;
    bool decode = false;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (ch == S_O_VOCAB) {
            vocab = optarg;
        } else if (ch == S_O_MERGES) {
            merges = optarg;
        } else if (ch == S_O_TOKENIZER) {
            path = optarg;
        } else if (ch == S_O_FILE) {
            file = optarg;
        } else if (ch == S_O_DECODE) {
            decode = true;
        } else if (ch == 'h') {
            kvedge_cli_usage(stdout, &cmd, s_help);
            return KVEDGE_EXIT_OK;
        } else {
            kvedge_cli_error("tokenize: unknown option or missing value '%s' (see kvedge tokenize "
                             "--help)",
                             argv[optind - 1]);
            return KVEDGE_EXIT_USAGE;
        }
    }
    if (optind != argc) {
        kvedge_cli_error("tokenize: unexpected argument '%s'", argv[optind]);
        return KVEDGE_EXIT_USAGE;
    }
    if (!path == !(vocab || merges) || (!path && (!vocab || !merges))) {
        kvedge_cli_error("tokenize: give the tokenizer once: --vocab FILE with --merges FILE, or "
                         "--tokenizer PATH");
        return KVEDGE_EXIT_USAGE;
    }
    kvedge_tokenizer_t *t = NULL;
    int ex = s_load(vocab, merges, path, &t);
    if (ex)
        return ex;
    FILE *in = file ? fopen(file, "rb") : stdin;
    char *text = NULL;
    size_t len = 0;
    if (!in || s_slurp(in, &text, &len) != 0) {
        kvedge_cli_error("tokenize: cannot read %s: %s", file ? file : "stdin", strerror(errno));
        ex = KVEDGE_EXIT_FAILURE;
    }
    if (in && in != stdin)
        fclose(in);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!ex && decode) {
        char *out = NULL;
        size_t olen = 0;
        ex = s_parse_ids(t, file ? file : "stdin", text, &ids, &n);
        if (!ex && kvedge_tokenizer_decode(t, ids, n, &out, &olen) != KVEDGE_OK) {
            kvedge_cli_error("tokenize: out of memory");
            ex = KVEDGE_EXIT_FAILURE;
        }
        if (!ex && cli->json) {
            printf("{\"text\":");
            kvedge_e2e_json_text(stdout, out, olen);
            printf(",\"bytes\":%zu}\n", olen);
        } else if (!ex) {
            fwrite(out, 1, olen, stdout);
        }
        free(out);
    } else if (!ex) {
        int rc = kvedge_tokenizer_encode(t, text, len, &ids, &n);
        if (rc != KVEDGE_OK) {
            kvedge_cli_error("tokenize: cannot encode %s: %s", file ? file : "stdin",
                             kvedge_strerror(rc));
            ex = KVEDGE_EXIT_FAILURE;
        } else {
            if (cli->json)
                fputs("{\"ids\":[", stdout);
            for (size_t i = 0; i < n; i++)
                printf("%s%d", i ? (cli->json ? "," : " ") : "", ids[i]);
            if (cli->json)
                printf("],\"count\":%zu}", n);
            printf("\n");
        }
    }
    if (!ex && (fflush(stdout) != 0 || ferror(stdout))) {
        kvedge_cli_error("tokenize: cannot write the output: %s", strerror(errno));
        ex = KVEDGE_EXIT_FAILURE;
    }
    free(ids);
    free(text);
    kvedge_tokenizer_destroy(&t);
    return ex;
}

const kvedge_cli_cmd_t kvedge_cli_tokenize_cmds[] = {
    {"tokenize", s_cmd_tokenize,
     "(--vocab FILE --merges FILE | --tokenizer PATH) [--file FILE] [--decode]",
     "Text to token ids, or ids back to text, with a byte-level BPE (GPT-2, OPT)."},
    {NULL, NULL, NULL, NULL},
};
