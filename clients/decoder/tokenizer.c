/* The byte-level BPE tokenizer: vocabularies read and checked (cJSON), GPT-2's pre-tokenization or
 * a tokenizer.json's Split regex (PCRE2), Qwen2's NFC normalizer (utf8proc), added tokens matched
 * before the regex, merges applied in rank order with a heap, a locked word cache, decoding to
 * bytes. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "clients/decoder/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <utf8proc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/codec/error.h"
#include "access/codec/why.h"

/* JavaScript's \s, written out, because GPT-2's reference encoder is JavaScript: PCRE2's \s
 * with UCP also takes U+0085 and U+180E and leaves out U+FEFF. */
#define S_WS                                                                                       \
    "\\x{09}-\\x{0D}\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"         \
    "\\x{205F}\\x{3000}\\x{FEFF}"
/* GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static const char s_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" S_WS
                                "\\p{L}\\p{N}]+|[" S_WS "]+(?![^" S_WS "])|[" S_WS "]+";

/* \s of Hugging Face's regex engine (Oniguruma): Unicode's White_Space, written out for PCRE2
 * (whose \s with UCP also takes U+180E, White_Space no more since Unicode 6.3), as the inside of
 * a character class. */
#define S_WS_ONIG                                                                                  \
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"           \
    "\\x{202F}\\x{205F}\\x{3000}"
/* Longest Split regex read from a tokenizer.json (Llama 3's is 99 bytes). */
#define S_PATTERN_MAX_BYTES 4096u
/* The longest a Split regex becomes once \s and \S are written out. */
#define S_PATTERN_OUT_BYTES (S_PATTERN_MAX_BYTES * 40u)

/* Striped locks of the word cache. */
#define S_LOCKS 64
/* Bytes of a token quoted in a message (longer ones are cut, "..." added). */
#define S_QUOTE_BYTES 64
/* Highest code point the byte map uses: 256 + the 68 bytes that are not printable. */
#define S_U2B_SIZE 0x144

typedef struct {
    uint32_t str;  /* offset of the token string, as the file writes it, in strs */
    uint32_t len;  /* its bytes (a NUL follows) */
    uint32_t raw;  /* offset of the token's decoded bytes in raw */
    uint32_t nraw; /* their count */
    int32_t id;
    bool in_model; /* in the BPE model's vocabulary (false: only an added token) */
} s_tok_t;

typedef struct {
    uint32_t tok;  /* index into toks */
    uint32_t len;  /* its bytes */
    uint8_t first; /* its first byte */
    bool special;  /* matched only when the caller allows special tokens */
} s_added_t;

typedef struct {
    uint64_t key;   /* (left << 32 | right) + 1; 0 = empty slot */
    uint32_t rank;  /* position in the merges: lower merges first */
    int32_t merged; /* id of left + right */
} s_merge_t;

typedef struct {
    uint8_t len; /* bytes of word; 0 = empty slot */
    uint8_t n;   /* ids */
    char word[KVEDGE_TOKENIZER_CACHE_WORD_MAX_BYTES];
    int32_t ids[KVEDGE_TOKENIZER_CACHE_IDS_MAX];
} s_slot_t;

struct kvedge_tokenizer_t {
    s_tok_t *toks;          /* the vocabulary, in file order */
    uint32_t n_toks;        /* its tokens */
    char *strs;             /* token strings, each NUL-terminated */
    uint8_t *raw;           /* decoded bytes of the tokens */
    uint32_t *vhash;        /* token string -> index into toks + 1 (0 = empty); open addressing */
    uint32_t vmask;         /* slots of vhash - 1 */
    int32_t *by_id;         /* id -> index into toks, -1 for ids nobody has; vocab_size entries */
    uint32_t vocab_size;    /* largest id + 1 */
    s_merge_t *mhash;       /* (left, right) -> rank, merged; open addressing */
    uint32_t mmask;         /* slots of mhash - 1 */
    uint32_t n_merges;      /* merges */
    int32_t byte_id[256];   /* the single-byte token of each byte */
    s_slot_t *cache;        /* KVEDGE_TOKENIZER_CACHE_WORDS entries, direct-mapped */
    pcre2_code *re;         /* a tokenizer.json's Split regex; NULL: GPT-2's pattern (s_re) */
    bool ignore_merges;     /* a piece that is in the model's vocabulary is one id, unmerged */
    bool nfc;               /* text is NFC-normalized (between added tokens) before the regex */
    s_added_t *added;       /* added tokens, by first byte, longest first */
    uint32_t n_added;       /* their count */
    uint32_t added_at[257]; /* added[added_at[b] .. added_at[b + 1]) start with byte b */
    int32_t bos_id;         /* the template's token before the text, -1 for none */
    int32_t eos_id;         /* the template's token after the text, -1 for none */
    pthread_mutex_t locks[S_LOCKS]; /* cache slot i is guarded by locks[i % S_LOCKS] */
};

/* ---------------------------------------------------------------- shared tables */

static pthread_once_t s_once = PTHREAD_ONCE_INIT;
static pcre2_code *s_re;          /* compiled once, shared by every tokenizer (read-only) */
static uint16_t s_b2u[256];       /* GPT-2's bytes_to_unicode */
static int16_t s_u2b[S_U2B_SIZE]; /* its inverse; -1 for code points it does not use */

static void s_init_once(void)
{
    /* Printable bytes stand for themselves; the others take 256, 257, ... in byte order. */
    int n = 0;
    for (int i = 0; i < S_U2B_SIZE; i++)
        s_u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        s_b2u[b] = (uint16_t)(printable ? b : 256 + n++);
        s_u2b[s_b2u[b]] = (int16_t)b;
    }
    int err;
    PCRE2_SIZE off;
    s_re = pcre2_compile((PCRE2_SPTR)s_pattern, PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    if (s_re) /* where JIT is unavailable, pcre2_match interprets */
        (void)pcre2_jit_compile(s_re, PCRE2_JIT_COMPLETE);
}

/* ---------------------------------------------------------------- small helpers */

static uint64_t s_hash(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 14695981039346656037ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static uint64_t s_mix(uint64_t x)
{
    x ^= x >> 33; /* splitmix64's finalizer */
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* The code point at s (n bytes left) into *cp; returns its length, 0 when s does not start with
 * valid UTF-8 (overlong forms, surrogates and code points over U+10FFFF are invalid). */
static size_t s_utf8(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    uint8_t c = s[0];
    size_t len;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

/* Writes code point cp (< 0x800) as UTF-8; returns its length. */
static size_t s_put_utf8(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* s (n bytes) quoted for a message: control bytes, quotes, backslashes and bytes that are not
 * UTF-8 escaped as \xNN, cut at a character boundary with "..." when long. */
static const char *s_quote(const char *s, size_t n, char out[S_QUOTE_BYTES])
{
    size_t k = 0;
    out[k++] = '"';
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp;
        size_t len = s_utf8((const uint8_t *)s + i, n - i, &cp);
        if (k + 8 >= S_QUOTE_BYTES) {
            memcpy(out + k, "...", 3);
            k += 3;
            break;
        }
        if (len == 0 || c < 0x20 || c == 0x7F || c == '"' || c == '\\') {
            k += (size_t)snprintf(out + k, S_QUOTE_BYTES - k, "\\x%02x", c);
            i++;
        } else {
            memcpy(out + k, s + i, len);
            k += len;
            i += len;
        }
    }
    out[k++] = '"';
    out[k] = '\0';
    return out;
}

/* Reads the whole file at path into a new buffer (NUL-terminated), refusing one over
 * KVEDGE_TOKENIZER_FILE_MAX_BYTES. */
static int s_read_file(const char *path, char **out, size_t *len, char *why, size_t why_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        kvedge_why(why, why_len, KVEDGE_EIO, "%s: cannot open: %s", path, strerror(e));
        errno = e;
        return KVEDGE_EIO;
    }
    struct stat st = {0};
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        errno = EISDIR;
        return kvedge_why(why, why_len, KVEDGE_EIO, "%s: is a directory", path);
    }
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > KVEDGE_TOKENIZER_FILE_MAX_BYTES) {
        fclose(f);
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                          "%s: over the limit of %u bytes (KVEDGE_TOKENIZER_FILE_MAX_BYTES)", path,
                          KVEDGE_TOKENIZER_FILE_MAX_BYTES);
    }
    /* Room for the whole file and one byte more, so that the read after it sees the end; a
     * file that grows, or a pipe, is still cut off at the limit below. */
    size_t cap = 1 << 16, n = 0;
    if (S_ISREG(st.st_mode) && st.st_size >= 0)
        cap = (size_t)st.st_size + 2;
    char *buf = malloc(cap);
    int rc = buf ? KVEDGE_OK : KVEDGE_ENOMEM;
    while (rc == KVEDGE_OK) {
        if (n + 1 >= cap) {
            if (n > KVEDGE_TOKENIZER_FILE_MAX_BYTES) {
                rc = kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                                "%s: over the limit of %u bytes (KVEDGE_TOKENIZER_FILE_MAX_BYTES)",
                                path, KVEDGE_TOKENIZER_FILE_MAX_BYTES);
                break;
            }
            size_t ncap = cap * 2 > (size_t)KVEDGE_TOKENIZER_FILE_MAX_BYTES + 2
                              ? (size_t)KVEDGE_TOKENIZER_FILE_MAX_BYTES + 2
                              : cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                rc = KVEDGE_ENOMEM;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                int e = errno;
                rc = kvedge_why(why, why_len, KVEDGE_EIO, "%s: cannot read: %s", path, strerror(e));
                errno = e;
            }
            break;
        }
    }
    if (rc == KVEDGE_OK && n > KVEDGE_TOKENIZER_FILE_MAX_BYTES)
        rc = kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                        "%s: over the limit of %u bytes (KVEDGE_TOKENIZER_FILE_MAX_BYTES)", path,
                        KVEDGE_TOKENIZER_FILE_MAX_BYTES);
    fclose(f);
    if (rc != KVEDGE_OK) {
        free(buf);
        if (rc == KVEDGE_ENOMEM)
            kvedge_why(why, why_len, rc, "%s: out of memory", path);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- the object */

static kvedge_tokenizer_t *s_new(void)
{
    kvedge_tokenizer_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->cache = calloc(KVEDGE_TOKENIZER_CACHE_WORDS, sizeof *t->cache);
    if (!t->cache) {
        free(t);
        return NULL;
    }
    for (int i = 0; i < S_LOCKS; i++)
        pthread_mutex_init(&t->locks[i], NULL);
    t->bos_id = t->eos_id = -1;
    return t;
}

void kvedge_tokenizer_destroy(kvedge_tokenizer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_tokenizer_t *t = *self_p;
    for (int i = 0; i < S_LOCKS; i++)
        pthread_mutex_destroy(&t->locks[i]);
    pcre2_code_free(t->re);
    free(t->added);
    free(t->cache);
    free(t->mhash);
    free(t->by_id);
    free(t->vhash);
    free(t->raw);
    free(t->strs);
    free(t->toks);
    free(t);
    *self_p = NULL;
}

/* Index into toks of the token string s (n bytes), or -1. */
static int64_t s_find(const kvedge_tokenizer_t *t, const char *s, size_t n)
{
    if (!t->vhash)
        return -1;
    for (uint32_t i = (uint32_t)s_hash(s, n) & t->vmask;; i = (i + 1) & t->vmask) {
        uint32_t v = t->vhash[i];
        if (v == 0)
            return -1;
        const s_tok_t *k = &t->toks[v - 1];
        if (k->len == n && memcmp(t->strs + k->str, s, n) == 0)
            return v - 1;
    }
}

static const s_merge_t *s_merge_find(const kvedge_tokenizer_t *t, int32_t left, int32_t right)
{
    uint64_t key = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    for (uint32_t i = (uint32_t)s_mix(key) & t->mmask;; i = (i + 1) & t->mmask) {
        const s_merge_t *m = &t->mhash[i];
        if (m->key == key)
            return m;
        if (m->key == 0)
            return NULL;
    }
}

/* Smallest power of two >= 2n (at least 16). */
static uint32_t s_slots(uint32_t n)
{
    uint32_t s = 16;
    while (s < 2 * (uint64_t)n)
        s *= 2;
    return s;
}

/* ---------------------------------------------------------------- the vocabulary */

/* Fills the vocabulary from a JSON object of token string to id, with room for extra_n more
 * tokens of extra_bytes bytes in all (the added tokens). label names the file and key the path
 * of the object in it ("" for the top level). */
static int s_vocab(kvedge_tokenizer_t *t, const cJSON *obj, const char *label, const char *key,
                   size_t extra_n, size_t extra_bytes, char *why, size_t why_len)
{
    char q[S_QUOTE_BYTES], q2[S_QUOTE_BYTES];
    if (!cJSON_IsObject(obj))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: %s is not a JSON object of token to id", label,
                          key[0] ? key : "the top level");
    size_t count = 0, bytes = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        if (++count > KVEDGE_TOKENIZER_VOCAB_MAX)
            return kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                              "%s: %s has more than %u tokens (KVEDGE_TOKENIZER_VOCAB_MAX)", label,
                              key[0] ? key : "the vocabulary", KVEDGE_TOKENIZER_VOCAB_MAX);
        bytes += strlen(c->string) + 1;
    }
    if (count == 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s has no tokens", label,
                          key[0] ? key : "the vocabulary");
    if (count + extra_n > KVEDGE_TOKENIZER_VOCAB_MAX)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                          "%s: %s and added_tokens have more than %u tokens "
                          "(KVEDGE_TOKENIZER_VOCAB_MAX)",
                          label, key[0] ? key : "the vocabulary", KVEDGE_TOKENIZER_VOCAB_MAX);
    bytes += extra_bytes;
    if (bytes > UINT32_MAX)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG, "%s: the tokens are too long", label);
    t->toks = calloc(count + extra_n, sizeof *t->toks);
    t->strs = malloc(bytes);
    t->raw = malloc(bytes);
    uint32_t slots = s_slots((uint32_t)(count + extra_n));
    t->vhash = calloc(slots, sizeof *t->vhash);
    if (!t->toks || !t->strs || !t->raw || !t->vhash)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", label);
    t->vmask = slots - 1;
    uint32_t so = 0, ro = 0, max_id = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        const char *s = c->string;
        size_t n = strlen(s);
        const char *pre = key[0] ? key : "key", *open = key[0] ? "[" : " ",
                   *close = key[0] ? "]" : "";
        if (n == 0)
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s%s\"\"%s: empty token", label,
                              pre, open, close);
        if (n > KVEDGE_TOKENIZER_TOKEN_MAX_BYTES)
            return kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                              "%s: %s%s%s%s: %zu bytes, over the limit of %u "
                              "(KVEDGE_TOKENIZER_TOKEN_MAX_BYTES)",
                              label, pre, open, s_quote(s, n, q), close, n,
                              KVEDGE_TOKENIZER_TOKEN_MAX_BYTES);
        if (!cJSON_IsNumber(c))
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s%s%s%s: the id is not a number",
                              label, pre, open, s_quote(s, n, q), close);
        double d = c->valuedouble;
        if (!(d >= 0 && d < KVEDGE_TOKENIZER_VOCAB_MAX) || d != floor(d))
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: %s%s%s%s: id %g is not an integer in 0..%u", label, pre, open,
                              s_quote(s, n, q), close, d, KVEDGE_TOKENIZER_VOCAB_MAX - 1);
        /* Decoded bytes: characters of the byte map stand for their byte, others for their
         * own UTF-8 (as Hugging Face's ByteLevel decoder does). */
        uint32_t raw0 = ro;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = s_utf8((const uint8_t *)s + i, n - i, &cp);
            if (k == 0)
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "%s: %s%s%s%s: not valid UTF-8 at byte %zu", label, pre, open,
                                  s_quote(s, n, q), close, i);
            if (cp < S_U2B_SIZE && s_u2b[cp] >= 0) {
                t->raw[ro++] = (uint8_t)s_u2b[cp];
            } else {
                memcpy(t->raw + ro, s + i, k);
                ro += (uint32_t)k;
            }
            i += k;
        }
        uint32_t idx = t->n_toks;
        for (uint32_t i = (uint32_t)s_hash(s, n) & t->vmask;; i = (i + 1) & t->vmask) {
            if (t->vhash[i] == 0) {
                t->vhash[i] = idx + 1;
                break;
            }
            const s_tok_t *k = &t->toks[t->vhash[i] - 1];
            if (k->len == n && memcmp(t->strs + k->str, s, n) == 0)
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s%s%s%s appears twice",
                                  label, pre, open, s_quote(s, n, q), close);
        }
        memcpy(t->strs + so, s, n + 1);
        t->toks[idx] = (s_tok_t){.str = so,
                                 .len = (uint32_t)n,
                                 .raw = raw0,
                                 .nraw = ro - raw0,
                                 .id = (int32_t)d,
                                 .in_model = true};
        so += (uint32_t)n + 1;
        t->n_toks++;
        if ((uint32_t)d > max_id)
            max_id = (uint32_t)d;
    }
    t->vocab_size = max_id + 1;
    t->by_id = malloc((size_t)t->vocab_size * sizeof *t->by_id);
    if (!t->by_id)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", label);
    for (uint32_t i = 0; i < t->vocab_size; i++)
        t->by_id[i] = -1;
    for (uint32_t i = 0; i < t->n_toks; i++) {
        const s_tok_t *k = &t->toks[i];
        if (t->by_id[k->id] >= 0) {
            const s_tok_t *o = &t->toks[t->by_id[k->id]];
            return kvedge_why(
                why, why_len, KVEDGE_ECORRUPT, "%s: %s%s%s%s and %s%s%s%s both have id %d", label,
                key[0] ? key : "key", key[0] ? "[" : " ", s_quote(t->strs + o->str, o->len, q),
                key[0] ? "]" : "", key[0] ? key : "key", key[0] ? "[" : " ",
                s_quote(t->strs + k->str, k->len, q2), key[0] ? "]" : "", k->id);
        }
        t->by_id[k->id] = (int32_t)i;
    }
    for (int b = 0; b < 256; b++) {
        char s[2];
        size_t n = s_put_utf8(s_b2u[b], s);
        int64_t i = s_find(t, s, n);
        if (i < 0)
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: no token for byte 0x%02x (%s): a byte-level vocabulary needs "
                              "all 256",
                              label, b, s_quote(s, n, q));
        t->byte_id[b] = t->toks[i].id;
    }
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- merges */

/* Where a merge was written, for messages: merges.txt's line or tokenizer.json's index. */
typedef struct {
    const char *label; /* the file */
    bool json;         /* model.merges[INDEX], else LINE */
    long first;        /* line of the merge of rank 0 (merges.txt) */
} s_where_t;

static long s_pos(const s_where_t *w, uint32_t rank)
{
    return w->json ? (long)rank : w->first + (long)rank;
}

/* "FILE:LINE: " or "FILE: model.merges[I]: " for the merge of rank rank. */
static const char *s_at(const s_where_t *w, uint32_t rank, char *buf, size_t len)
{
    if (w->json)
        snprintf(buf, len, "%s: model.merges[%u]: ", w->label, rank);
    else
        snprintf(buf, len, "%s:%ld: ", w->label, s_pos(w, rank));
    return buf;
}

static int s_merges_alloc(kvedge_tokenizer_t *t, size_t count, const s_where_t *w, char *why,
                          size_t why_len)
{
    if (count > KVEDGE_TOKENIZER_MERGES_MAX)
        return kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                          "%s: more than %u merges (KVEDGE_TOKENIZER_MERGES_MAX)", w->label,
                          KVEDGE_TOKENIZER_MERGES_MAX);
    uint32_t slots = s_slots((uint32_t)count);
    t->mhash = calloc(slots, sizeof *t->mhash);
    if (!t->mhash)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", w->label);
    t->mmask = slots - 1;
    return KVEDGE_OK;
}

/* Adds the merge a + b (an bytes, bn bytes) at the next rank. */
static int s_merge_add(kvedge_tokenizer_t *t, const char *a, size_t an, const char *b, size_t bn,
                       const s_where_t *w, char *why, size_t why_len)
{
    char at[128], q[S_QUOTE_BYTES], q2[S_QUOTE_BYTES];
    uint32_t rank = t->n_merges;
    int64_t ia = s_find(t, a, an), ib = s_find(t, b, bn);
    if (ia < 0 || ib < 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%stoken %s is not in the vocabulary",
                          s_at(w, rank, at, sizeof at),
                          ia < 0 ? s_quote(a, an, q) : s_quote(b, bn, q));
    char cat[KVEDGE_TOKENIZER_TOKEN_MAX_BYTES];
    int64_t im = -1;
    if (an + bn <= sizeof cat) {
        memcpy(cat, a, an);
        memcpy(cat + an, b, bn);
        im = s_find(t, cat, an + bn);
    }
    if (im < 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s%s + %s: the merged token is not in the vocabulary",
                          s_at(w, rank, at, sizeof at), s_quote(a, an, q), s_quote(b, bn, q2));
    int32_t left = t->toks[ia].id, right = t->toks[ib].id;
    uint64_t key = ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
    for (uint32_t i = (uint32_t)s_mix(key) & t->mmask;; i = (i + 1) & t->mmask) {
        s_merge_t *m = &t->mhash[i];
        if (m->key == key)
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s%s %s repeats %s %ld",
                              s_at(w, rank, at, sizeof at), s_quote(a, an, q), s_quote(b, bn, q2),
                              w->json ? "model.merges index" : "line", s_pos(w, m->rank));
        if (m->key == 0) {
            *m = (s_merge_t){.key = key, .rank = rank, .merged = t->toks[im].id};
            break;
        }
    }
    t->n_merges++;
    return KVEDGE_OK;
}

/* merges.txt: "#version..." first (optional), then "a b" a line; blank lines only at the end. */
static int s_merges_txt(kvedge_tokenizer_t *t, const char *buf, size_t len, const char *label,
                        char *why, size_t why_len)
{
    s_where_t w = {.label = label, .json = false, .first = 1};
    const char *p = buf, *end = buf + len;
    size_t lines = 1;
    for (const char *c = buf; (c = memchr(c, '\n', (size_t)(end - c))) != NULL; c++)
        lines++;
    int rc = s_merges_alloc(t, lines, &w, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    long line = 0, blank = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *e = nl ? nl : end;
        line++;
        size_t n = (size_t)(e - p);
        if (n && p[n - 1] == '\r')
            n--;
        if (line == 1 && n >= 8 && memcmp(p, "#version", 8) == 0) {
            w.first = 2;
        } else if (n == 0) {
            if (!blank)
                blank = line;
        } else if (blank) {
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s:%ld: empty line (blank lines may only end the file)", label,
                              blank);
        } else {
            const char *sp = memchr(p, ' ', n);
            if (!sp || sp == p || sp == p + n - 1 || memchr(sp + 1, ' ', (size_t)(p + n - sp - 1)))
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "%s:%ld: expected two tokens separated by one space", label,
                                  line);
            rc = s_merge_add(t, p, (size_t)(sp - p), sp + 1, (size_t)(p + n - sp - 1), &w, why,
                             why_len);
            if (rc != KVEDGE_OK)
                return rc;
        }
        p = nl ? nl + 1 : end;
    }
    return KVEDGE_OK;
}

/* tokenizer.json's model.merges: "a b" strings or ["a", "b"] pairs. */
static int s_merges_json(kvedge_tokenizer_t *t, const cJSON *arr, const char *label, char *why,
                         size_t why_len)
{
    s_where_t w = {.label = label, .json = true};
    if (!cJSON_IsArray(arr))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: model.merges is not an array", label);
    int rc = s_merges_alloc(t, (size_t)cJSON_GetArraySize(arr), &w, why, why_len);
    uint32_t i = 0;
    for (const cJSON *m = arr->child; rc == KVEDGE_OK && m; m = m->next, i++) {
        if (cJSON_IsString(m)) {
            const char *s = m->valuestring, *sp = strchr(s, ' ');
            size_t n = strlen(s);
            if (!sp || sp == s || sp == s + n - 1 || strchr(sp + 1, ' '))
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "%s: model.merges[%u]: expected two tokens separated by one "
                                  "space",
                                  label, i);
            rc = s_merge_add(t, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), &w, why, why_len);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next) && m->child->valuestring[0] &&
                   m->child->next->valuestring[0]) {
            const char *a = m->child->valuestring, *b = m->child->next->valuestring;
            rc = s_merge_add(t, a, strlen(a), b, strlen(b), &w, why, why_len);
        } else {
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: model.merges[%u]: expected \"a b\" or [\"a\", \"b\"]", label, i);
        }
    }
    return rc;
}

/* ---------------------------------------------------------------- loading */

/* Parses len bytes of JSON; NULL with a reason naming the byte offset on a syntax error. */
static cJSON *s_json(const char *buf, size_t len, const char *label, int *rc, char *why,
                     size_t why_len)
{
    const char *end = NULL;
    cJSON *j = len ? cJSON_ParseWithLengthOpts(buf, len, &end, 0) : NULL;
    if (j) { /* cJSON stops after the value: only whitespace may follow */
        while (end < buf + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
            end++;
        if (end == buf + len)
            return j;
        cJSON_Delete(j);
    }
    if (!end || end < buf || end > buf + len)
        end = buf + len;
    size_t off = (size_t)(end - buf), line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        line += buf[i] == '\n';
        col = buf[i] == '\n' ? 1 : col + 1;
    }
    *rc = kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s at byte %zu (line %zu, column %zu)",
                     label, j ? "trailing bytes after the JSON value" : "invalid JSON", off, line,
                     col);
    return NULL;
}

static int s_finish(kvedge_tokenizer_t *t, int rc, kvedge_tokenizer_t **out)
{
    if (rc != KVEDGE_OK) {
        kvedge_tokenizer_destroy(&t);
        return rc;
    }
    *out = t;
    return KVEDGE_OK;
}

static int s_parse(const char *vocab, size_t vocab_len, const char *vlabel, const char *merges,
                   size_t merges_len, const char *mlabel, kvedge_tokenizer_t **out, char *why,
                   size_t why_len)
{
    pthread_once(&s_once, s_init_once);
    if (!s_re)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "cannot compile the pattern");
    kvedge_tokenizer_t *t = s_new();
    if (!t)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    int rc = KVEDGE_OK;
    cJSON *j = s_json(vocab, vocab_len, vlabel, &rc, why, why_len);
    if (j) {
        rc = s_vocab(t, j, vlabel, "", 0, 0, why, why_len);
        cJSON_Delete(j);
    }
    if (rc == KVEDGE_OK)
        rc = s_merges_txt(t, merges, merges_len, mlabel, why, why_len);
    return s_finish(t, rc, out);
}

/* The "type" of a tokenizer.json component, or NULL when it has none that is a string. */
static const char *s_type(const cJSON *v)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    return cJSON_IsString(type) ? type->valuestring : NULL;
}

/* "%s: KEY type "X" is not supported (WHAT)" for component v at key. */
static int s_unsupported(const cJSON *v, const char *label, const char *key, const char *what,
                         char *why, size_t why_len)
{
    char q[S_QUOTE_BYTES];
    const char *type = s_type(v);
    if (!cJSON_IsObject(v) || !type)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s has no \"type\" (%s)", label, key,
                          what);
    return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s type %s is not supported (%s)", label,
                      key, s_quote(type, strlen(type), q), what);
}

/* A ByteLevel pre-tokenizer at key: no prefix space; use_regex as want_regex says (absent means
 * true, as in Hugging Face). */
static int s_byte_level(const cJSON *v, bool want_regex, const char *label, const char *key,
                        char *why, size_t why_len)
{
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "add_prefix_space")))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s.add_prefix_space: not supported",
                          label, key);
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(v, "use_regex");
    bool regex = !cJSON_IsFalse(re);
    if (regex != want_regex)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s.use_regex %s: not supported %s",
                          label, key, regex ? "true" : "false",
                          want_regex ? "without a Split before it"
                                     : "after a Split (the Split's regex pre-tokenizes)");
    return KVEDGE_OK;
}

/* Hugging Face's regex (Oniguruma syntax) for PCRE2: \s and \S written out as Oniguruma reads
 * them; the rest of the Llama 3 / Qwen2 patterns means the same in both. *out is a new
 * NUL-terminated string. Refused: \S inside a class, and a class inside a class (Oniguruma's
 * nested sets and POSIX brackets). */
static int s_onig_to_pcre2(const char *in, size_t n, char **out, const char *label, const char *key,
                           char *why, size_t why_len)
{
    char *o = malloc(S_PATTERN_OUT_BYTES);
    if (!o)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", label);
    size_t k = 0;
    bool in_class = false;
    const char *bad = NULL;
    for (size_t i = 0; i < n && !bad;) {
        const char *src = in + i;
        size_t len = 1;
        if (in[i] == '\\' && i + 1 < n) {
            len = 2;
            if (in[i + 1] == 's') {
                src = in_class ? S_WS_ONIG : "[" S_WS_ONIG "]";
                len = strlen(src);
            } else if (in[i + 1] == 'S' && !in_class) {
                src = "[^" S_WS_ONIG "]";
                len = strlen(src);
            } else if (in[i + 1] == 'S') {
                bad = "\\S inside a character class";
            }
            i += 2;
        } else if (in[i] == '[' && in_class) {
            bad = "a character class inside a class";
        } else if (in[i] == '[') {
            /* "[", "[^", then a ']' right after is a literal one. */
            in_class = true;
            if (i + len < n && in[i + len] == '^')
                len++;
            if (i + len < n && in[i + len] == ']')
                len++;
            i += len;
        } else {
            in_class = in_class && in[i] != ']';
            i++;
        }
        if (!bad && k + len + 1 > S_PATTERN_OUT_BYTES)
            bad = "too long once \\s is written out";
        if (!bad) {
            memcpy(o + k, src, len);
            k += len;
        }
    }
    if (bad) {
        free(o);
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: %s.pattern.Regex: %s is not supported", label, key, bad);
    }
    o[k] = '\0';
    *out = o;
    return KVEDGE_OK;
}

/* A Split pre-tokenizer at key: a Regex pattern, Isolated, not inverted. Compiles it into
 * t->re. */
static int s_split(kvedge_tokenizer_t *t, const cJSON *v, const char *label, const char *key,
                   char *why, size_t why_len)
{
    char q[S_QUOTE_BYTES];
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(v, "behavior");
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: %s.behavior %s is not supported (only \"Isolated\")", label, key,
                          cJSON_IsString(behavior)
                              ? s_quote(behavior->valuestring, strlen(behavior->valuestring), q)
                              : "(missing)");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "invert")))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s.invert: not supported", label,
                          key);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(v, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if (!cJSON_IsString(re))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: %s.pattern: only {\"Regex\": \"...\"} is supported", label, key);
    size_t n = strlen(re->valuestring);
    if (n == 0 || n > S_PATTERN_MAX_BYTES)
        return kvedge_why(why, why_len, n ? KVEDGE_ETOOBIG : KVEDGE_ECORRUPT,
                          "%s: %s.pattern.Regex: %zu bytes (1..%u)", label, key, n,
                          S_PATTERN_MAX_BYTES);
    char *pcre = NULL;
    int rc = s_onig_to_pcre2(re->valuestring, n, &pcre, label, key, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    int err;
    PCRE2_SIZE off;
    t->re = pcre2_compile((PCRE2_SPTR)pcre, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    free(pcre);
    if (!t->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s.pattern.Regex: %s", label, key,
                          (const char *)msg);
    }
    uint32_t min = 0;
    if (pcre2_pattern_info(t->re, PCRE2_INFO_MINLENGTH, &min) != 0 || min == 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: %s.pattern.Regex: may match the empty string (not supported)", label,
                          key);
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
    return KVEDGE_OK;
}

/* pre_tokenizer: GPT-2's ByteLevel, or Llama 3's / Qwen2's Sequence of a Split and a ByteLevel
 * without its regex. */
static int s_pre_tokenizer(kvedge_tokenizer_t *t, const cJSON *v, const char *label, char *why,
                           size_t why_len)
{
    static const char what[] = "ByteLevel, or a Sequence of Split and ByteLevel";
    if (!v || cJSON_IsNull(v))
        return KVEDGE_OK;
    const char *type = s_type(v);
    if (type && strcmp(type, "ByteLevel") == 0)
        return s_byte_level(v, true, label, "pre_tokenizer", why, why_len);
    if (!type || strcmp(type, "Sequence") != 0)
        return s_unsupported(v, label, "pre_tokenizer", what, why, why_len);
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(v, "pretokenizers");
    if (!cJSON_IsArray(seq) || cJSON_GetArraySize(seq) != 2)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: pre_tokenizer.pretokenizers: only [Split, ByteLevel] is supported",
                          label);
    const cJSON *split = seq->child, *bl = seq->child->next;
    type = s_type(split);
    if (!type || strcmp(type, "Split") != 0)
        return s_unsupported(split, label, "pre_tokenizer.pretokenizers[0]", "only Split", why,
                             why_len);
    type = s_type(bl);
    if (!type || strcmp(type, "ByteLevel") != 0)
        return s_unsupported(bl, label, "pre_tokenizer.pretokenizers[1]", "only ByteLevel", why,
                             why_len);
    int rc = s_byte_level(bl, false, label, "pre_tokenizer.pretokenizers[1]", why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_split(t, split, label, "pre_tokenizer.pretokenizers[0]", why, why_len);
    return rc;
}

/* tokenizer.json's settings that would change what Hugging Face gives: read, or refused naming
 * the component; never ignored. */
static int s_json_settings(kvedge_tokenizer_t *t, const cJSON *root, const cJSON *model,
                           const char *label, char *why, size_t why_len)
{
    char q[S_QUOTE_BYTES];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (v && !(cJSON_IsString(v) && strcmp(v->valuestring, "BPE") == 0))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: model.type %s is not supported (only BPE models are supported)",
                          label,
                          cJSON_IsString(v) ? s_quote(v->valuestring, strlen(v->valuestring), q)
                                            : "(not a string)");
    v = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: model.dropout: BPE dropout is not supported", label);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: model.%s: not supported by a byte-level BPE", label, affixes[i]);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: model.byte_fallback: not supported (a SentencePiece-style BPE)",
                          label);
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    v = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (v && !cJSON_IsNull(v)) {
        const char *type = s_type(v);
        if (!type || strcmp(type, "NFC") != 0)
            return s_unsupported(v, label, "normalizer", "only NFC", why, why_len);
        t->nfc = true;
    }
    int rc = s_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), label, why,
                             why_len);
    if (rc != KVEDGE_OK)
        return rc;
    v = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (v && !cJSON_IsNull(v) && !(s_type(v) && strcmp(s_type(v), "ByteLevel") == 0))
        return s_unsupported(v, label, "decoder", "only ByteLevel", why, why_len);
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- added tokens */

/* Counts added_tokens' entries and their content bytes (+ 1 each), for s_vocab to make room. */
static void s_added_size(const cJSON *arr, size_t *n, size_t *bytes)
{
    *n = *bytes = 0;
    if (!cJSON_IsArray(arr))
        return;
    for (const cJSON *a = arr->child; a; a = a->next) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        (*n)++;
        if (cJSON_IsString(c))
            *bytes += strlen(c->valuestring) + 1;
    }
}

/* By first byte, then longest first. */
static int s_added_cmp(const void *pa, const void *pb)
{
    const s_added_t *a = pa, *b = pb;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    return a->len != b->len ? (a->len > b->len ? -1 : 1) : 0;
}

/* added_tokens: each {"id", "content", "special", ...}. A token the model's vocabulary has must
 * have its id there; one it lacks takes its id and decodes to its content. */
static int s_added(kvedge_tokenizer_t *t, const cJSON *arr, bool normalizer, const char *label,
                   char *why, size_t why_len)
{
    char q[S_QUOTE_BYTES], q2[S_QUOTE_BYTES];
    if (!arr || cJSON_IsNull(arr))
        return KVEDGE_OK;
    if (!cJSON_IsArray(arr))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: added_tokens is not an array", label);
    size_t count = (size_t)cJSON_GetArraySize(arr);
    if (count == 0)
        return KVEDGE_OK;
    t->added = calloc(count, sizeof *t->added);
    if (!t->added)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", label);
    uint32_t so = 0, ro = 0;
    for (uint32_t i = 0; i < t->n_toks; i++) {
        const s_tok_t *k = &t->toks[i];
        so = k->str + k->len + 1 > so ? k->str + k->len + 1 : so;
        ro = k->raw + k->nraw > ro ? k->raw + k->nraw : ro;
    }
    uint32_t i = 0;
    for (const cJSON *a = arr->child; a; a = a->next, i++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        const cJSON *idv = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!cJSON_IsObject(a) || !cJSON_IsString(c) || !cJSON_IsNumber(idv))
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: added_tokens[%u]: expected an object with \"id\" and "
                              "\"content\"",
                              label, i);
        const char *s = c->valuestring;
        size_t n = strlen(s);
        uint32_t cp;
        if (n == 0)
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: added_tokens[%u].content: empty token", label, i);
        if (n > KVEDGE_TOKENIZER_TOKEN_MAX_BYTES)
            return kvedge_why(why, why_len, KVEDGE_ETOOBIG,
                              "%s: added_tokens[%u].content: %zu bytes, over the limit of %u "
                              "(KVEDGE_TOKENIZER_TOKEN_MAX_BYTES)",
                              label, i, n, KVEDGE_TOKENIZER_TOKEN_MAX_BYTES);
        for (size_t b = 0, k; b < n; b += k)
            if ((k = s_utf8((const uint8_t *)s + b, n - b, &cp)) == 0)
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "%s: added_tokens[%u].content: not valid UTF-8 at byte %zu",
                                  label, i, b);
        double d = idv->valuedouble;
        if (!(d >= 0 && d < KVEDGE_TOKENIZER_VOCAB_MAX) || d != floor(d))
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: added_tokens[%u]: id %g is not an integer in 0..%u", label, i, d,
                              KVEDGE_TOKENIZER_VOCAB_MAX - 1);
        static const char *const refused[] = {"single_word", "lstrip", "rstrip"};
        for (int r = 0; r < 3; r++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, refused[r])))
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "%s: added_tokens[%u].%s: not supported", label, i, refused[r]);
        /* Hugging Face matches a normalized added token in the normalized text: not done here. */
        if (normalizer && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "normalized")))
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: added_tokens[%u].normalized: not supported with a normalizer",
                              label, i);
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(a, "special");
        bool special = cJSON_IsTrue(sp);
        if (sp && !cJSON_IsBool(sp))
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: added_tokens[%u].special: not true or false", label, i);
        int32_t id = (int32_t)d;
        int64_t have = s_find(t, s, n);
        if (have >= 0 && !t->toks[have].in_model)
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: added_tokens[%u]: %s appears twice", label, i, s_quote(s, n, q));
        if (have >= 0 && t->toks[have].id != id)
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: added_tokens[%u]: %s has id %d, but model.vocab gives it %d",
                              label, i, s_quote(s, n, q), id, t->toks[have].id);
        if (have < 0) {
            if ((uint32_t)id < t->vocab_size && t->by_id[id] >= 0) {
                const s_tok_t *o = &t->toks[t->by_id[id]];
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "%s: added_tokens[%u]: %s and %s both have id %d", label, i,
                                  s_quote(s, n, q), s_quote(t->strs + o->str, o->len, q2), id);
            }
            if ((uint32_t)id >= t->vocab_size) {
                int32_t *nb = realloc(t->by_id, ((size_t)id + 1) * sizeof *nb);
                if (!nb)
                    return kvedge_why(why, why_len, KVEDGE_ENOMEM, "%s: out of memory", label);
                for (uint32_t k = t->vocab_size; k <= (uint32_t)id; k++)
                    nb[k] = -1;
                t->by_id = nb;
                t->vocab_size = (uint32_t)id + 1;
            }
            uint32_t idx = t->n_toks++;
            memcpy(t->strs + so, s, n + 1);
            memcpy(t->raw + ro, s, n);
            t->toks[idx] = (s_tok_t){.str = so,
                                     .len = (uint32_t)n,
                                     .raw = ro,
                                     .nraw = (uint32_t)n,
                                     .id = id,
                                     .in_model = false};
            so += (uint32_t)n + 1;
            ro += (uint32_t)n;
            for (uint32_t h = (uint32_t)s_hash(s, n) & t->vmask;; h = (h + 1) & t->vmask)
                if (t->vhash[h] == 0) {
                    t->vhash[h] = idx + 1;
                    break;
                }
            t->by_id[id] = (int32_t)idx;
            have = idx;
        } else {
            for (uint32_t k = 0; k < t->n_added; k++)
                if (t->added[k].tok == (uint32_t)have)
                    return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                      "%s: added_tokens[%u]: %s appears twice", label, i,
                                      s_quote(s, n, q));
        }
        t->added[t->n_added++] = (s_added_t){
            .tok = (uint32_t)have, .len = (uint32_t)n, .first = (uint8_t)s[0], .special = special};
    }
    qsort(t->added, t->n_added, sizeof *t->added, s_added_cmp);
    uint32_t k = 0;
    for (int b = 0; b < 256; b++) {
        t->added_at[b] = k;
        while (k < t->n_added && t->added[k].first == b)
            k++;
    }
    t->added_at[256] = k;
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- the template */

/* The id of the template's special token named name ("<|begin_of_text|>"): its one id in
 * special_tokens, which must be a token of the vocabulary. */
static int s_template_id(const kvedge_tokenizer_t *t, const cJSON *specials, const char *name,
                         const char *label, const char *key, int32_t *id, char *why, size_t why_len)
{
    char q[S_QUOTE_BYTES];
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(specials, name);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(e, "ids");
    if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) != 1 || !cJSON_IsNumber(ids->child))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: %s: special_tokens[%s] has not exactly one id", label, key,
                          s_quote(name, strlen(name), q));
    double d = ids->child->valuedouble;
    if (!(d >= 0 && d < t->vocab_size) || d != floor(d) || t->by_id[(uint32_t)d] < 0)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                          "%s: %s: special_tokens[%s]: id %g is not in the vocabulary", label, key,
                          s_quote(name, strlen(name), q), d);
    *id = (int32_t)d;
    return KVEDGE_OK;
}

/* A TemplateProcessing's "single": at most one special token before the text (BOS) and one
 * after it (EOS). */
static int s_template(kvedge_tokenizer_t *t, const cJSON *v, const char *label, const char *key,
                      char *why, size_t why_len)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(v, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(v, "special_tokens");
    if (!cJSON_IsArray(single))
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s.single is not an array", label,
                          key);
    int before = 0, after = 0, seqs = 0;
    uint32_t i = 0;
    for (const cJSON *e = single->child; e; e = e->next, i++) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(st, "id");
        if (cJSON_IsObject(sq)) {
            const cJSON *sid = cJSON_GetObjectItemCaseSensitive(sq, "id");
            if (!cJSON_IsString(sid) || strcmp(sid->valuestring, "A") != 0 || seqs++)
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "%s: %s.single[%u]: only one Sequence, \"A\", is supported",
                                  label, key, i);
        } else if (cJSON_IsString(name)) {
            if ((seqs ? after++ : before++) > 0)
                return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                                  "%s: %s.single[%u]: more than one special token %s the text is "
                                  "not supported",
                                  label, key, i, seqs ? "after" : "before");
            int rc = s_template_id(t, specials, name->valuestring, label, key,
                                   seqs ? &t->eos_id : &t->bos_id, why, why_len);
            if (rc != KVEDGE_OK)
                return rc;
        } else {
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: %s.single[%u]: expected a SpecialToken or a Sequence", label,
                              key, i);
        }
    }
    if (seqs != 1)
        return kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: %s.single: no Sequence \"A\"", label,
                          key);
    return KVEDGE_OK;
}

/* post_processor: none, ByteLevel (it moves offsets only), TemplateProcessing, or a Sequence of
 * those with at most one template. */
static int s_post_processor(kvedge_tokenizer_t *t, const cJSON *v, const char *label, char *why,
                            size_t why_len)
{
    static const char what[] = "ByteLevel, TemplateProcessing or a Sequence of them";
    if (!v || cJSON_IsNull(v))
        return KVEDGE_OK;
    const char *type = s_type(v);
    const cJSON *list = v, *one = NULL;
    bool seq = type && strcmp(type, "Sequence") == 0;
    if (seq) {
        list = cJSON_GetObjectItemCaseSensitive(v, "processors");
        if (!cJSON_IsArray(list))
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: post_processor.processors is not an array", label);
        one = list->child;
    } else {
        one = v;
    }
    int templates = 0;
    uint32_t i = 0;
    for (; one; one = seq ? one->next : NULL, i++) {
        char key[64];
        if (seq)
            snprintf(key, sizeof key, "post_processor.processors[%u]", i);
        else
            snprintf(key, sizeof key, "post_processor");
        type = s_type(one);
        if (type && strcmp(type, "ByteLevel") == 0)
            continue;
        if (!type || strcmp(type, "TemplateProcessing") != 0)
            return s_unsupported(one, label, key, what, why, why_len);
        if (templates++)
            return kvedge_why(why, why_len, KVEDGE_ECORRUPT,
                              "%s: %s: a second TemplateProcessing is not supported", label, key);
        int rc = s_template(t, one, label, key, why, why_len);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

static int s_parse_json(const char *json, size_t len, const char *label, kvedge_tokenizer_t **out,
                        char *why, size_t why_len)
{
    pthread_once(&s_once, s_init_once);
    if (!s_re)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "cannot compile the pattern");
    kvedge_tokenizer_t *t = s_new();
    if (!t)
        return kvedge_why(why, why_len, KVEDGE_ENOMEM, "out of memory");
    int rc = KVEDGE_OK;
    cJSON *root = s_json(json, len, label, &rc, why, why_len);
    if (root) {
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
        const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
        size_t added_n = 0, added_bytes = 0;
        s_added_size(added, &added_n, &added_bytes);
        if (!cJSON_IsObject(model))
            rc = kvedge_why(why, why_len, KVEDGE_ECORRUPT, "%s: no \"model\" object", label);
        if (rc == KVEDGE_OK)
            rc = s_json_settings(t, root, model, label, why, why_len);
        if (rc == KVEDGE_OK)
            rc = s_vocab(t, cJSON_GetObjectItemCaseSensitive(model, "vocab"), label, "model.vocab",
                         added_n, added_bytes, why, why_len);
        if (rc == KVEDGE_OK)
            rc = s_merges_json(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), label, why,
                               why_len);
        if (rc == KVEDGE_OK)
            rc = s_added(t, added, t->nfc, label, why, why_len);
        if (rc == KVEDGE_OK)
            rc = s_post_processor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"),
                                  label, why, why_len);
        cJSON_Delete(root);
    }
    return s_finish(t, rc, out);
}

int kvedge_tokenizer_parse(const char *vocab, size_t vocab_len, const char *merges,
                           size_t merges_len, kvedge_tokenizer_t **out, char *why, size_t why_len)
{
    if (out)
        *out = NULL;
    if ((!vocab && vocab_len) || (!merges && merges_len) || !out)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "NULL argument");
    return s_parse(vocab ? vocab : "", vocab_len, "vocab.json", merges ? merges : "", merges_len,
                   "merges.txt", out, why, why_len);
}

int kvedge_tokenizer_parse_json(const char *json, size_t len, kvedge_tokenizer_t **out, char *why,
                                size_t why_len)
{
    if (out)
        *out = NULL;
    if ((!json && len) || !out)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "NULL argument");
    return s_parse_json(json ? json : "", len, "tokenizer.json", out, why, why_len);
}

int kvedge_tokenizer_load(const char *vocab_path, const char *merges_path, kvedge_tokenizer_t **out,
                          char *why, size_t why_len)
{
    if (out)
        *out = NULL;
    if (!vocab_path || !merges_path || !out)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "NULL argument");
    char *v = NULL, *m = NULL;
    size_t vl = 0, ml = 0;
    int rc = s_read_file(vocab_path, &v, &vl, why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_read_file(merges_path, &m, &ml, why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_parse(v, vl, vocab_path, m, ml, merges_path, out, why, why_len);
    free(m);
    free(v);
    return rc;
}

int kvedge_tokenizer_load_json(const char *path, kvedge_tokenizer_t **out, char *why,
                               size_t why_len)
{
    if (out)
        *out = NULL;
    if (!path || !out)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "NULL argument");
    char *buf = NULL;
    size_t len = 0;
    int rc = s_read_file(path, &buf, &len, why, why_len);
    if (rc == KVEDGE_OK)
        rc = s_parse_json(buf, len, path, out, why, why_len);
    free(buf);
    return rc;
}

int kvedge_tokenizer_load_dir(const char *dir, kvedge_tokenizer_t **out, char *why, size_t why_len)
{
    if (out)
        *out = NULL;
    if (!dir || !out)
        return kvedge_why(why, why_len, KVEDGE_EINVAL, "NULL argument");
    size_t n = strlen(dir) + sizeof "/tokenizer.json";
    char *v = malloc(n), *m = malloc(n), *j = malloc(n);
    int rc = KVEDGE_ENOMEM;
    if (v && m && j) {
        snprintf(v, n, "%s/vocab.json", dir);
        snprintf(m, n, "%s/merges.txt", dir);
        snprintf(j, n, "%s/tokenizer.json", dir);
        if (access(v, F_OK) == 0 && access(m, F_OK) == 0)
            rc = kvedge_tokenizer_load(v, m, out, why, why_len);
        else if (access(j, F_OK) == 0)
            rc = kvedge_tokenizer_load_json(j, out, why, why_len);
        else
            rc = kvedge_why(why, why_len, KVEDGE_ENOTFOUND,
                            "%s: has neither vocab.json + merges.txt nor tokenizer.json", dir);
    } else {
        kvedge_why(why, why_len, rc, "out of memory");
    }
    free(j);
    free(m);
    free(v);
    return rc;
}

int kvedge_tokenizer_load_path(const char *path, kvedge_tokenizer_t **out, char *why,
                               size_t why_len)
{
    struct stat st;
    if (path && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return kvedge_tokenizer_load_dir(path, out, why, why_len);
    return kvedge_tokenizer_load_json(path, out, why, why_len);
}

uint32_t kvedge_tokenizer_vocab_size(const kvedge_tokenizer_t *t)
{
    return t ? t->vocab_size : 0;
}

int32_t kvedge_tokenizer_token_id(const kvedge_tokenizer_t *t, const char *token)
{
    if (!t || !token)
        return -1;
    int64_t i = s_find(t, token, strlen(token));
    return i < 0 ? -1 : t->toks[i].id;
}

/* ---------------------------------------------------------------- encoding */

/* A merge candidate: the pair starting at symbol pos, whose merge has this rank. */
typedef struct {
    uint32_t rank, pos;
} s_cand_t;

/* Scratch of one encode call, grown to the longest word. */
typedef struct {
    size_t cap;     /* symbols the arrays hold */
    int32_t *sym;   /* id of the symbol starting at byte i; -1 once merged into its left */
    int32_t *next;  /* the next live symbol, -1 at the end */
    int32_t *prev;  /* the previous live symbol, -1 at the start */
    uint32_t *done; /* symbols that merged in the current pass */
    s_cand_t *heap; /* candidates, lowest (rank, pos) first; 3 per symbol at most */
    s_cand_t *pass; /* the candidates of the current rank */
} s_scratch_t;

static void s_scratch_free(s_scratch_t *sc)
{
    free(sc->sym);
    free(sc->next);
    free(sc->prev);
    free(sc->done);
    free(sc->heap);
    free(sc->pass);
}

static int s_scratch_grow(s_scratch_t *sc, size_t n)
{
    if (n <= sc->cap)
        return KVEDGE_OK;
    if (n > SIZE_MAX / (3 * sizeof(s_cand_t)))
        return KVEDGE_ENOMEM;
    s_scratch_free(sc);
    *sc = (s_scratch_t){0};
    sc->sym = malloc(n * sizeof *sc->sym);
    sc->next = malloc(n * sizeof *sc->next);
    sc->prev = malloc(n * sizeof *sc->prev);
    sc->done = malloc(n * sizeof *sc->done);
    sc->heap = malloc(3 * n * sizeof *sc->heap);
    sc->pass = malloc(3 * n * sizeof *sc->pass);
    if (!sc->sym || !sc->next || !sc->prev || !sc->done || !sc->heap || !sc->pass)
        return KVEDGE_ENOMEM;
    sc->cap = n;
    return KVEDGE_OK;
}

static bool s_before(s_cand_t a, s_cand_t b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void s_sift_down(s_cand_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < n && s_before(h[l], h[m]))
            m = l;
        if (l + 1 < n && s_before(h[l + 1], h[m]))
            m = l + 1;
        if (m == i)
            return;
        s_cand_t x = h[i];
        h[i] = h[m];
        h[m] = x;
        i = m;
    }
}

static void s_push(s_cand_t *h, size_t *n, s_cand_t c)
{
    size_t i = (*n)++;
    while (i > 0 && s_before(c, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static s_cand_t s_pop(s_cand_t *h, size_t *n)
{
    s_cand_t top = h[0];
    h[0] = h[--*n];
    s_sift_down(h, *n, 0);
    return top;
}

/* Pushes the pair starting at symbol p when it is a merge. */
static void s_candidate(const kvedge_tokenizer_t *t, s_scratch_t *sc, size_t *hn, int32_t p)
{
    int32_t q = sc->next[p];
    if (q < 0)
        return;
    const s_merge_t *m = s_merge_find(t, sc->sym[p], sc->sym[q]);
    if (m)
        s_push(sc->heap, hn, (s_cand_t){m->rank, (uint32_t)p});
}

/* BPE of one word (n >= 2 bytes) into out; returns the count of ids. GPT-2's loop: take the
 * pair of lowest rank and merge every occurrence of it left to right, until no pair is a merge.
 * Here a heap of candidate pairs finds that rank, and a pass takes its candidates in position
 * order, so a word costs O(n log n) rather than GPT-2's O(n^2). */
static size_t s_bpe(const kvedge_tokenizer_t *t, const uint8_t *w, size_t n, s_scratch_t *sc,
                    int32_t *out)
{
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        sc->sym[i] = t->byte_id[w[i]];
        sc->prev[i] = (int32_t)i - 1;
        sc->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const s_merge_t *m = s_merge_find(t, sc->sym[i], sc->sym[i + 1]);
        if (m)
            sc->heap[hn++] = (s_cand_t){m->rank, (uint32_t)i};
    }
    for (size_t i = hn / 2; i-- > 0;)
        s_sift_down(sc->heap, hn, i);
    while (hn > 0) {
        uint32_t rank = sc->heap[0].rank;
        size_t np = 0, nd = 0;
        while (hn > 0 && sc->heap[0].rank == rank)
            sc->pass[np++] = s_pop(sc->heap, &hn);
        for (size_t k = 0; k < np; k++) {
            int32_t p = (int32_t)sc->pass[k].pos, q;
            /* Stale candidates (a symbol merged since) no longer name this rank's pair. */
            if (sc->sym[p] < 0 || (q = sc->next[p]) < 0)
                continue;
            const s_merge_t *m = s_merge_find(t, sc->sym[p], sc->sym[q]);
            if (!m || m->rank != rank)
                continue;
            sc->sym[p] = m->merged;
            sc->sym[q] = -1;
            sc->next[p] = sc->next[q];
            if (sc->next[q] >= 0)
                sc->prev[sc->next[q]] = p;
            sc->done[nd++] = (uint32_t)p;
        }
        /* New pairs join only after the pass, as GPT-2 rescans only then. */
        for (size_t k = 0; k < nd; k++) {
            int32_t p = (int32_t)sc->done[k];
            if (sc->prev[p] >= 0)
                s_candidate(t, sc, &hn, sc->prev[p]);
            s_candidate(t, sc, &hn, p);
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = sc->next[i])
        out[k++] = sc->sym[i];
    return k;
}

/* The id of piece w (n bytes) when the model's vocabulary has it whole (ignore_merges), else -1:
 * the piece is looked up as the vocabulary writes it, each byte through GPT-2's byte map. */
static int32_t s_whole(const kvedge_tokenizer_t *t, const char *w, size_t n)
{
    char s[KVEDGE_TOKENIZER_TOKEN_MAX_BYTES];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k + 2 > sizeof s)
            return -1;
        k += s_put_utf8(s_b2u[(uint8_t)w[i]], s + k);
    }
    int64_t i = s_find(t, s, k);
    return i >= 0 && t->toks[i].in_model ? t->toks[i].id : -1;
}

/* One word (a piece of the pattern) into out, through the cache; returns the count of ids or a
 * negative error. */
static int64_t s_word(kvedge_tokenizer_t *t, const char *w, size_t n, s_scratch_t *sc, int32_t *out)
{
    if (n == 1) {
        out[0] = t->byte_id[(uint8_t)w[0]];
        return 1;
    }
    if (t->ignore_merges) {
        int32_t id = s_whole(t, w, n);
        if (id >= 0) {
            out[0] = id;
            return 1;
        }
    }
    bool cacheable = n <= KVEDGE_TOKENIZER_CACHE_WORD_MAX_BYTES;
    uint32_t slot = 0;
    if (cacheable) {
        slot = (uint32_t)s_hash(w, n) & (KVEDGE_TOKENIZER_CACHE_WORDS - 1);
        s_slot_t *s = &t->cache[slot];
        pthread_mutex_t *lk = &t->locks[slot % S_LOCKS];
        pthread_mutex_lock(lk);
        bool hit = s->len == n && memcmp(s->word, w, n) == 0;
        if (hit)
            memcpy(out, s->ids, s->n * sizeof *out);
        size_t got = s->n;
        pthread_mutex_unlock(lk);
        if (hit)
            return (int64_t)got;
    }
    if (s_scratch_grow(sc, n) != KVEDGE_OK)
        return KVEDGE_ENOMEM;
    size_t k = s_bpe(t, (const uint8_t *)w, n, sc, out);
    if (cacheable && k <= KVEDGE_TOKENIZER_CACHE_IDS_MAX) {
        s_slot_t *s = &t->cache[slot];
        pthread_mutex_t *lk = &t->locks[slot % S_LOCKS];
        pthread_mutex_lock(lk);
        s->len = (uint8_t)n;
        s->n = (uint8_t)k;
        memcpy(s->word, w, n);
        memcpy(s->ids, out, k * sizeof *out);
        pthread_mutex_unlock(lk);
    }
    return (int64_t)k;
}

/* Ids being collected: grown as pieces come. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} s_ids_t;

/* Room for more ids. */
static int s_ids_room(s_ids_t *ids, size_t more)
{
    if (ids->n + more <= ids->cap)
        return KVEDGE_OK;
    size_t cap = ids->cap ? ids->cap : 16;
    while (cap < ids->n + more) {
        if (cap > SIZE_MAX / (2 * sizeof *ids->v))
            return KVEDGE_ENOMEM;
        cap *= 2;
    }
    int32_t *v = realloc(ids->v, cap * sizeof *v);
    if (!v)
        return KVEDGE_ENOMEM;
    ids->v = v;
    ids->cap = cap;
    return KVEDGE_OK;
}

/* A piece the regex did not match (text it skipped: bytes that are not UTF-8, or what a Split
 * regex leaves between matches): its valid UTF-8 runs are words, every other byte a piece of its
 * own. Room for n ids is made by the caller. */
static int s_gap(kvedge_tokenizer_t *t, const char *g, size_t n, s_scratch_t *sc, s_ids_t *ids)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i, k;
        uint32_t cp;
        while (j < n && (k = s_utf8((const uint8_t *)g + j, n - j, &cp)) > 0)
            j += k;
        if (j > i) {
            int64_t got = s_word(t, g + i, j - i, sc, ids->v + ids->n);
            if (got < 0)
                return (int)got;
            ids->n += (size_t)got;
            i = j;
        } else {
            ids->v[ids->n++] = t->byte_id[(uint8_t)g[i++]];
        }
    }
    return KVEDGE_OK;
}

/* One stretch of text between added tokens: normalized (NFC) when the tokenizer says so, split
 * by the pattern, each piece through BPE. */
static int s_segment(kvedge_tokenizer_t *t, const char *text, size_t len, pcre2_match_data *md,
                     s_scratch_t *sc, s_ids_t *ids)
{
    char *norm = NULL;
    if (t->nfc && len > 0) {
        /* Valid UTF-8 runs are composed; bytes that are not UTF-8 stay as they are. */
        size_t cap = len + 16, k = 0;
        norm = malloc(cap);
        if (!norm)
            return KVEDGE_ENOMEM;
        for (size_t i = 0; i < len;) {
            size_t j = i, c;
            uint32_t cp;
            while (j < len && (c = s_utf8((const uint8_t *)text + j, len - j, &cp)) > 0)
                j += c;
            const char *piece = text + i;
            size_t pn = j > i ? j - i : 1;
            utf8proc_uint8_t *nfc = NULL;
            if (j > i) {
                utf8proc_ssize_t got =
                    utf8proc_map((const utf8proc_uint8_t *)piece, (utf8proc_ssize_t)pn, &nfc,
                                 UTF8PROC_STABLE | UTF8PROC_COMPOSE);
                if (got < 0) {
                    free(norm);
                    return got == UTF8PROC_ERROR_NOMEM ? KVEDGE_ENOMEM : KVEDGE_ETOOBIG;
                }
                piece = (const char *)nfc;
                pn = (size_t)got;
            }
            if (k + pn > cap) {
                size_t ncap = cap;
                while (ncap < k + pn)
                    ncap *= 2;
                char *nb = realloc(norm, ncap);
                if (!nb) {
                    free(nfc);
                    free(norm);
                    return KVEDGE_ENOMEM;
                }
                norm = nb;
                cap = ncap;
            }
            memcpy(norm + k, piece, pn);
            k += pn;
            free(nfc);
            i = j > i ? j : i + 1;
        }
        if (k > INT32_MAX) {
            free(norm);
            return KVEDGE_ETOOBIG;
        }
        text = norm;
        len = k;
    }
    /* Every piece gives at most one id per byte. */
    int rc = s_ids_room(ids, len);
    const pcre2_code *re = t->re ? t->re : s_re;
    size_t pos = 0;
    while (rc == KVEDGE_OK && pos < len) {
        int m = pcre2_match(re, (PCRE2_SPTR)text, len, pos, 0, md, NULL);
        size_t start = len, end = len;
        if (m > 0) {
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            start = ov[0];
            end = ov[1];
        } else if (m != PCRE2_ERROR_NOMATCH) {
            rc = m == PCRE2_ERROR_NOMEMORY ? KVEDGE_ENOMEM : KVEDGE_ETOOBIG;
            break;
        }
        if (start > pos)
            rc = s_gap(t, text + pos, start - pos, sc, ids);
        if (rc == KVEDGE_OK && end > start) {
            int64_t got = s_word(t, text + start, end - start, sc, ids->v + ids->n);
            if (got < 0)
                rc = (int)got;
            else
                ids->n += (size_t)got;
            pos = end;
        } else if (rc == KVEDGE_OK && start < len) {
            /* An empty match: patterns that allow one are refused at load; never loop. */
            rc = s_gap(t, text + start, 1, sc, ids);
            pos = start + 1;
        } else {
            pos = len;
        }
    }
    free(norm);
    return rc;
}

/* The leftmost added token in text[from..len) that flags allow, the longest where several start
 * there: its position in *at, its index into added; -1 when none. */
static int64_t s_next_added(const kvedge_tokenizer_t *t, const char *text, size_t len, size_t from,
                            unsigned flags, size_t *at)
{
    if (t->n_added == 0)
        return -1;
    for (size_t i = from; i < len; i++) {
        uint8_t b = (uint8_t)text[i];
        for (uint32_t k = t->added_at[b]; k < t->added_at[b + 1]; k++) {
            const s_added_t *a = &t->added[k];
            const s_tok_t *tok = &t->toks[a->tok];
            if (a->special && !(flags & KVEDGE_TOKENIZER_SPECIAL))
                continue;
            if (tok->len <= len - i && memcmp(text + i, t->strs + tok->str, tok->len) == 0) {
                *at = i;
                return k;
            }
        }
    }
    return -1;
}

int kvedge_tokenizer_encode_ex(kvedge_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                               int32_t **ids, size_t *n)
{
    if (ids)
        *ids = NULL;
    if (n)
        *n = 0;
    if (!t || !ids || !n || (!text && len) ||
        (flags & ~(KVEDGE_TOKENIZER_SPECIAL | KVEDGE_TOKENIZER_TEMPLATE)))
        return KVEDGE_EINVAL;
    if (len > INT32_MAX)
        return KVEDGE_ETOOBIG;
    bool tmpl = flags & KVEDGE_TOKENIZER_TEMPLATE;
    s_ids_t out = {0};
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->re ? t->re : s_re, NULL);
    s_scratch_t sc = {0};
    int rc = md ? s_ids_room(&out, len + 2) : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK && tmpl && t->bos_id >= 0)
        out.v[out.n++] = t->bos_id;
    size_t pos = 0;
    while (rc == KVEDGE_OK && pos < len) {
        size_t at = len;
        int64_t k = s_next_added(t, text, len, pos, flags, &at);
        rc = s_segment(t, text + pos, at - pos, md, &sc, &out);
        if (rc == KVEDGE_OK && k >= 0) {
            const s_tok_t *tok = &t->toks[t->added[k].tok];
            rc = s_ids_room(&out, 1);
            if (rc == KVEDGE_OK)
                out.v[out.n++] = tok->id;
            at += tok->len;
        }
        pos = at;
    }
    if (rc == KVEDGE_OK && tmpl && t->eos_id >= 0) {
        rc = s_ids_room(&out, 1);
        if (rc == KVEDGE_OK)
            out.v[out.n++] = t->eos_id;
    }
    s_scratch_free(&sc);
    pcre2_match_data_free(md);
    if (rc != KVEDGE_OK || out.n == 0) {
        free(out.v);
        return rc;
    }
    int32_t *fit = realloc(out.v, out.n * sizeof *out.v);
    *ids = fit ? fit : out.v;
    *n = out.n;
    return KVEDGE_OK;
}

int kvedge_tokenizer_encode(kvedge_tokenizer_t *t, const char *text, size_t len, int32_t **ids,
                            size_t *n)
{
    return kvedge_tokenizer_encode_ex(t, text, len, 0, ids, n);
}

int32_t kvedge_tokenizer_bos_id(const kvedge_tokenizer_t *t)
{
    return t ? t->bos_id : -1;
}

int32_t kvedge_tokenizer_eos_id(const kvedge_tokenizer_t *t)
{
    return t ? t->eos_id : -1;
}

/* ---------------------------------------------------------------- decoding */

int kvedge_tokenizer_decode(const kvedge_tokenizer_t *t, const int32_t *ids, size_t n, char **text,
                            size_t *len)
{
    if (text)
        *text = NULL;
    if (len)
        *len = 0;
    if (!t || !text || !len || (!ids && n))
        return KVEDGE_EINVAL;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->vocab_size || t->by_id[ids[i]] < 0)
            return KVEDGE_EINVAL;
        total += t->toks[t->by_id[ids[i]]].nraw;
        if (total > SIZE_MAX / 2)
            return KVEDGE_ENOMEM;
    }
    char *buf = malloc(total + 1);
    if (!buf)
        return KVEDGE_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const s_tok_t *tok = &t->toks[t->by_id[ids[i]]];
        memcpy(buf + k, t->raw + tok->raw, tok->nraw);
        k += tok->nraw;
    }
    buf[k] = '\0';
    *text = buf;
    *len = k;
    return KVEDGE_OK;
}
