/* Fuzz target for the byte-level BPE tokenizer (clients/decoder/tokenizer.h): vocabularies from
 * disk and any text. Built with libFuzzer (KVEDGE_FUZZ=ON, clang) it fuzzes; built normally it
 * replays the committed corpus.
 *
 * The first byte picks what the rest is: even, vocab.json and merges.txt separated by the first
 * NUL byte (kvedge_tokenizer_parse); odd, a tokenizer.json (kvedge_tokenizer_parse_json: GPT-2's
 * form or Llama 3's / Qwen2's, with added tokens, templates and normalizers). Either way the rest
 * is also text for two small fixed tokenizers: GPT-2's form, and Llama 3's (a Split regex,
 * ignore_merges, added and special tokens, a BOS template). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "clients/decoder/tokenizer.h"
#include "access/codec/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Merges of the fixed tokenizer: enough for words, spaces, numbers and a few multi-byte
 * characters to merge in several ranks. */
static const char *const s_merges[][2] = {
    {"Ġ", "t"}, {"h", "e"},   {"Ġt", "he"}, {"i", "n"},  {"Ġ", "a"},  {"e", "r"},   {"o", "n"},
    {"Ġ", "Ġ"}, {"ĠĠ", "ĠĠ"}, {"1", "2"},   {"12", "3"}, {"Ã", "©"},  {"ä", "¸"},   {"ä¸", "Ń"},
    {"'", "s"}, {"a", "a"},   {"aa", "aa"}, {"Ċ", "Ċ"},  {"in", "g"}, {"Ġa", "nd"}, {"n", "d"},
    {"Ġ", "s"}, {"Ġs", "he"}, {"Ġth", "e"}, {"Ġ", "th"}, {"t", "h"},  {"ð", "Ł"},   {"s", "he"},
};

/* GPT-2's byte map (as tokenizer.c has it) for building the fixed vocabulary. */
static size_t s_byte_token(int b, char out[3])
{
    static const int first = 256;
    int cp = b, n = 0;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
        for (int i = 0; i < b; i++)
            n += !((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE);
        cp = first + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static kvedge_tokenizer_t *s_fixed_llama(const char *vocab, size_t v);

/* The fixed tokenizer, built on the first call and kept (reachable, so not a leak). */
static kvedge_tokenizer_t *s_fixed(void)
{
    static kvedge_tokenizer_t *t;
    if (t)
        return t;
    size_t nm = sizeof s_merges / sizeof s_merges[0];
    char *vocab = malloc(16 * (256 + nm) + 16), *merges = malloc(32 * nm + 32);
    if (!vocab || !merges)
        abort();
    size_t v = 0, m = 0;
    int id = 0;
    vocab[v++] = '{';
    for (int b = 0; b < 256; b++) {
        char s[3];
        size_t n = s_byte_token(b, s);
        const char *esc = s[0] == '"' ? "\\\"" : s[0] == '\\' ? "\\\\" : NULL;
        v += (size_t)sprintf(vocab + v, "%s\"%s%.*s\":%d", b ? "," : "", esc ? esc : "",
                             esc ? 0 : (int)n, s, id++);
    }
    m += (size_t)sprintf(merges + m, "#version: 0.2\n");
    for (size_t i = 0; i < nm; i++) {
        /* Two merges may make one token ("Ġt he", "Ġth e"): it is in the vocabulary once. */
        bool seen = false;
        char made[32], other[32];
        snprintf(made, sizeof made, "%s%s", s_merges[i][0], s_merges[i][1]);
        for (size_t k = 0; k < i && !seen; k++) {
            snprintf(other, sizeof other, "%s%s", s_merges[k][0], s_merges[k][1]);
            seen = strcmp(made, other) == 0;
        }
        if (!seen)
            v += (size_t)sprintf(vocab + v, ",\"%s\":%d", made, id++);
        m += (size_t)sprintf(merges + m, "%s %s\n", s_merges[i][0], s_merges[i][1]);
    }
    vocab[v++] = '}';
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    if (kvedge_tokenizer_parse(vocab, v, merges, m, &t, why, sizeof why) != KVEDGE_OK) {
        fprintf(stderr, "fuzz_tokenizer: the fixed tokenizer does not load: %s\n", why);
        abort();
    }
    s_fixed_llama(vocab, v);
    free(merges);
    free(vocab);
    return t;
}

/* Llama 3's pre-tokenizer regex, JSON-escaped. */
#define S_LLAMA3_RE                                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "         \
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"

/* The fixed tokenizer of Llama 3's form: the fixed GPT-2 vocabulary (vocab, v bytes, without its
 * closing brace) with added tokens, one special with a BOS template and one plain, and the same
 * merges as JSON pairs. Built on the first call and kept. */
static kvedge_tokenizer_t *s_fixed_llama(const char *vocab, size_t v)
{
    static kvedge_tokenizer_t *t;
    if (t || !vocab)
        return t;
    size_t nm = sizeof s_merges / sizeof s_merges[0], cap = v + 64 * nm + 4096, k = 0;
    char *doc = malloc(cap);
    if (!doc)
        abort();
    k += (size_t)snprintf(
        doc + k, cap - k,
        "{\"added_tokens\": [{\"id\": 5000, \"content\": \"<|begin_of_text|>\", \"special\": "
        "true}, {\"id\": 5001, \"content\": \"<x>\", \"special\": false}], \"normalizer\": null, "
        "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
        "\"pattern\": {\"Regex\": \"" S_LLAMA3_RE "\"}, \"behavior\": \"Isolated\", \"invert\": "
        "false}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}, \"post_processor\": "
        "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
        "\"<|begin_of_text|>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": "
        "{\"<|begin_of_text|>\": {\"ids\": [5000]}}}, \"model\": {\"type\": \"BPE\", "
        "\"ignore_merges\": true, \"vocab\": %.*s, \"merges\": [",
        (int)v, vocab);
    for (size_t i = 0; i < nm; i++)
        k += (size_t)snprintf(doc + k, cap - k, "%s[\"%s\", \"%s\"]", i ? ", " : "", s_merges[i][0],
                              s_merges[i][1]);
    k += (size_t)snprintf(doc + k, cap - k, "]}}");
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    if (kvedge_tokenizer_parse_json(doc, k, &t, why, sizeof why) != KVEDGE_OK) {
        fprintf(stderr, "fuzz_tokenizer: the fixed Llama tokenizer does not load: %s\n", why);
        abort();
    }
    free(doc);
    return t;
}

/* encode (with flags) then decode gives the text back; every id is one of t's. */
static void s_round_trip_flags(kvedge_tokenizer_t *t, const uint8_t *text, size_t len,
                               unsigned flags)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (kvedge_tokenizer_encode_ex(t, (const char *)text, len, flags, &ids, &n) != KVEDGE_OK)
        abort();
    if (n > len || (n == 0) != (len == 0))
        abort();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= kvedge_tokenizer_vocab_size(t))
            abort();
    char *back = NULL;
    size_t blen = 0;
    if (kvedge_tokenizer_decode(t, ids, n, &back, &blen) != KVEDGE_OK)
        abort();
    if (blen != len || (len && memcmp(back, text, len) != 0) || back[blen] != '\0')
        abort();
    free(back);
    free(ids);
}

static void s_round_trip(kvedge_tokenizer_t *t, const uint8_t *text, size_t len)
{
    s_round_trip_flags(t, text, len, 0);
}

/* The template's BOS comes first when asked for; every id is one of t's and decodes. */
static void s_template(kvedge_tokenizer_t *t, const uint8_t *text, size_t len)
{
    int32_t *ids = NULL;
    size_t n = 0;
    unsigned flags = KVEDGE_TOKENIZER_SPECIAL | KVEDGE_TOKENIZER_TEMPLATE;
    if (kvedge_tokenizer_encode_ex(t, (const char *)text, len, flags, &ids, &n) != KVEDGE_OK)
        abort();
    int32_t bos = kvedge_tokenizer_bos_id(t), eos = kvedge_tokenizer_eos_id(t);
    if (n < (size_t)(bos >= 0) + (size_t)(eos >= 0) || (bos >= 0 && ids[0] != bos) ||
        (eos >= 0 && ids[n - 1] != eos))
        abort();
    char *back = NULL;
    size_t blen = 0;
    if (kvedge_tokenizer_decode(t, ids, n, &back, &blen) != KVEDGE_OK)
        abort();
    free(back);
    free(ids);
}

/* Whether a tokenizer.json (len bytes) gives every text back exactly: not when it normalizes
 * (decoding gives the normalized text) or has added tokens (one that is also in the vocabulary
 * decodes as the vocabulary writes it, "Ġ" as " "). */
static bool s_exact(const uint8_t *json, size_t len)
{
    cJSON *j = cJSON_ParseWithLength((const char *)json, len);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(j, "normalizer");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    bool yes = (!n || cJSON_IsNull(n)) && cJSON_GetArraySize(a) == 0;
    cJSON_Delete(j);
    return yes;
}

/* A refused vocabulary leaves a reason and nothing else; an accepted one encodes any text (back
 * to the same bytes when it is exact), with its specials and template too. */
static void s_check(int rc, kvedge_tokenizer_t *t, const char *why, const uint8_t *text, size_t len,
                    bool exact)
{
    if (rc != KVEDGE_OK) {
        if (t || why[0] == '\0' || rc == KVEDGE_EINVAL)
            abort();
        return;
    }
    if (!t || kvedge_tokenizer_vocab_size(t) < 256)
        abort();
    static const char sample[] = "Hello, world! It's 2024: caf\xc3\xa9 \xe4\xb8\xad\xff  \n\tend";
    if (exact) {
        s_round_trip(t, (const uint8_t *)sample, sizeof sample - 1);
        s_round_trip(t, text, len);
        s_round_trip_flags(t, text, len, KVEDGE_TOKENIZER_SPECIAL);
    }
    s_template(t, (const uint8_t *)sample, sizeof sample - 1);
    s_template(t, text, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const uint8_t *rest = data + 1;
    size_t len = size - 1;
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    kvedge_tokenizer_t *t = NULL;
    int rc;
    bool exact = true;
    if (data[0] & 1) {
        rc = kvedge_tokenizer_parse_json((const char *)rest, len, &t, why, sizeof why);
        exact = rc != KVEDGE_OK || s_exact(rest, len);
    } else {
        const uint8_t *nul = memchr(rest, 0, len);
        size_t vl = nul ? (size_t)(nul - rest) : len;
        const char *merges = nul ? (const char *)nul + 1 : "";
        size_t ml = nul ? len - vl - 1 : 0;
        rc = kvedge_tokenizer_parse((const char *)rest, vl, merges, ml, &t, why, sizeof why);
    }
    s_check(rc, t, why, rest, len, exact);
    kvedge_tokenizer_destroy(&t);
    s_round_trip(s_fixed(), rest, len);
    kvedge_tokenizer_t *llama = s_fixed_llama(NULL, 0);
    s_round_trip_flags(llama, rest, len, 0);
    s_round_trip_flags(llama, rest, len, KVEDGE_TOKENIZER_SPECIAL);
    s_template(llama, rest, len);
    return 0;
}
