/* Tests of the byte-level BPE tokenizer: the ids of GPT-2's own encoder (gpt-3-encoder 1.1.4)
 * on the fixture corpus, the trained kjv vocabulary against its Python encoder, tokenizer.json
 * against vocab.json + merges.txt, round trips (invalid UTF-8 included), GPT-2's merge passes,
 * concurrency, every refusal of a bad file with its message, and the time of a 1 MB encode.
 *
 * Then `kvedge tokenize`, and `kvedge prefill` / `decode` with --tokenizer on a store node.
 *
 * argv[1]: the folder of GPT-2's encoder.json and vocab.bpe (ctest passes the one that
 * tests/tokenizer/fetch_gpt2.sh installs); its tests skip when it is missing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/spawn.h"
#include "clients/decoder/tokenizer.h"
#include "access/codec/error.h"

#define S_FIX KVEDGE_FIXTURES "/tokenizer"

static const char *s_gpt2_dir; /* argv[1] */

/* ---------------------------------------------------------------- helpers */

static char *s_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

static void s_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static char s_tmp[64];

static int s_setup_tmp(void **state)
{
    (void)state;
    snprintf(s_tmp, sizeof s_tmp, "/tmp/kvedge_tok_XXXXXX");
    return mkdtemp(s_tmp) ? 0 : -1;
}

static int s_teardown_tmp(void **state)
{
    (void)state;
    DIR *d = opendir(s_tmp);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", s_tmp, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
    rmdir(s_tmp);
    return 0;
}

/* A path in the test's temporary folder. */
static const char *s_path(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", s_tmp, name);
    return buf;
}

static double s_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool s_have_gpt2(char *enc, char *bpe, size_t len)
{
    if (!s_gpt2_dir)
        return false;
    snprintf(enc, len, "%s/encoder.json", s_gpt2_dir);
    snprintf(bpe, len, "%s/vocab.bpe", s_gpt2_dir);
    return access(enc, R_OK) == 0 && access(bpe, R_OK) == 0;
}

/* GPT-2's tokenizer, or NULL (the test is then skipped). */
static kvedge_tokenizer_t *s_gpt2(void)
{
    char enc[512], bpe[512], why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    if (!s_have_gpt2(enc, bpe, sizeof enc)) {
        print_message("GPT-2's encoder.json/vocab.bpe not found in %s (tests/tokenizer/"
                      "fetch_gpt2.sh installs them): skipped\n",
                      s_gpt2_dir ? s_gpt2_dir : "(no folder given)");
        return NULL;
    }
    kvedge_tokenizer_t *t = NULL;
    int rc = kvedge_tokenizer_load(enc, bpe, &t, why, sizeof why);
    if (rc != KVEDGE_OK)
        print_message("%s\n", why);
    assert_int_equal(rc, KVEDGE_OK);
    return t;
}

/* The kjv vocabulary from the committed tokenizer.json fixture. */
static kvedge_tokenizer_t *s_kjv_fixture(void)
{
    kvedge_tokenizer_t *t = NULL;
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    int rc = kvedge_tokenizer_load_json(S_FIX "/kjv/tokenizer.json", &t, why, sizeof why);
    if (rc != KVEDGE_OK)
        print_message("%s\n", why);
    assert_int_equal(rc, KVEDGE_OK);
    return t;
}

/* encode, then decode gives the same bytes; returns the ids (caller frees). */
static int32_t *s_round_trip(kvedge_tokenizer_t *t, const char *text, size_t len, size_t *n)
{
    int32_t *ids = NULL;
    assert_int_equal(kvedge_tokenizer_encode(t, text, len, &ids, n), KVEDGE_OK);
    assert_true(*n <= len);
    char *back = NULL;
    size_t blen = 0;
    assert_int_equal(kvedge_tokenizer_decode(t, ids, *n, &back, &blen), KVEDGE_OK);
    assert_int_equal(blen, len);
    assert_memory_equal(back, text, len);
    assert_int_equal(back[blen], '\0');
    free(back);
    return ids;
}

static void s_assert_ids(const char *what, const int32_t *got, size_t n, const cJSON *want)
{
    size_t wn = (size_t)cJSON_GetArraySize(want), i = 0;
    const cJSON *w = want->child;
    for (; i < n && w; i++, w = w->next)
        if (got[i] != w->valueint)
            break;
    if (i != n || n != wn) {
        print_message("%s: %zu ids, want %zu; first difference at %zu: got %d, want %d\n", what, n,
                      wn, i, i < n ? got[i] : -1, w ? w->valueint : -1);
        fail();
    }
}

/* ---------------------------------------------------------------- GPT-2 */

/* Every fixture text: exactly the ids gpt-3-encoder gives, and back to the same bytes. */
static void test_gpt2_fixtures(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_gpt2();
    if (!t)
        skip();
    assert_int_equal(kvedge_tokenizer_vocab_size(t), 50257);
    assert_int_equal(kvedge_tokenizer_token_id(t, "<|endoftext|>"), 50256);
    assert_int_equal(kvedge_tokenizer_token_id(t, "Ġthe"), 262);
    size_t len;
    char *json = s_read(S_FIX "/expected.json", &len);
    assert_non_null(json);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    const cJSON *texts = cJSON_GetObjectItemCaseSensitive(root, "texts");
    assert_true(cJSON_IsObject(texts));
    int count = 0;
    size_t total = 0;
    for (const cJSON *e = texts->child; e; e = e->next, count++) {
        char path[512];
        snprintf(path, sizeof path, "%s/texts/%s", S_FIX, e->string);
        size_t tl;
        char *text = s_read(path, &tl);
        assert_non_null(text);
        size_t n;
        int32_t *ids = s_round_trip(t, text, tl, &n);
        s_assert_ids(e->string, ids, n, e);
        /* Twice: the second time every short word comes from the cache. */
        free(ids);
        ids = s_round_trip(t, text, tl, &n);
        s_assert_ids(e->string, ids, n, e);
        total += n;
        free(ids);
        free(text);
    }
    /* Every committed text is in expected.json (and so was checked). */
    DIR *d = opendir(S_FIX "/texts");
    assert_non_null(d);
    int files = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        files += strlen(de->d_name) > 4 && strcmp(de->d_name + strlen(de->d_name) - 4, ".txt") == 0;
    closedir(d);
    assert_int_equal(files, count);
    assert_true(count >= 20);
    print_message("GPT-2: %d texts, %zu ids, all equal to gpt-3-encoder's\n", count, total);
    cJSON_Delete(root);
    free(json);
    kvedge_tokenizer_destroy(&t);
}

/* The pieces of GPT-2's pattern (as JavaScript's matchAll gives them), seen through ids: the
 * text encodes as its pieces encoded one by one. Contractions are lower case only; a space goes
 * with the word after it; \s is JavaScript's (U+FEFF is whitespace, U+0085 and U+180E are not);
 * a byte that is not UTF-8 is a piece alone. */
static void test_pieces(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_kjv_fixture();
    static const struct {
        const char *text;
        const char *pieces[8];
    } cases[] = {
        {"I'S", {"I", "'", "S"}},
        {"I's", {"I", "'s"}},
        {"don't'll", {"don", "'t", "'ll"}},
        {"a  b", {"a", " ", " b"}},
        {"a \n", {"a", " \n"}},
        {"x  \n\n y", {"x", "  \n\n", " y"}},
        {"x\xef\xbb\xbf\xef\xbb\xbfy", {"x", "\xef\xbb\xbf", "\xef\xbb\xbf", "y"}},
        {"a \xef\xbb\xbf"
         "b",
         {"a", " ", "\xef\xbb\xbf", "b"}},
        {"a \xc2\x85"
         "b",
         {"a", " \xc2\x85", "b"}},
        {"a \xe1\xa0\x8e"
         "b",
         {"a", " \xe1\xa0\x8e", "b"}},
        {"a\xff"
         "b",
         {"a", "\xff", "b"}},
        {"'\xffs", {"'", "\xff", "s"}},
        {"12ab 3", {"12", "ab", " 3"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n, k = 0;
        int32_t *ids = s_round_trip(t, cases[c].text, strlen(cases[c].text), &n);
        for (size_t p = 0; p < 8 && cases[c].pieces[p]; p++) {
            size_t pn;
            int32_t *pids = s_round_trip(t, cases[c].pieces[p], strlen(cases[c].pieces[p]), &pn);
            assert_true(k + pn <= n);
            assert_memory_equal(ids + k, pids, pn * sizeof *ids);
            k += pn;
            free(pids);
        }
        if (k != n)
            print_message("case %zu: %zu ids, the pieces give %zu\n", c, n, k);
        assert_int_equal(k, n);
        free(ids);
    }
    kvedge_tokenizer_destroy(&t);
}

/* Bytes that are not UTF-8 are pieces of one byte each; nothing crashes; decode gives them
 * back. Checked on GPT-2's vocabulary when at hand and always on kjv's. */
static void s_invalid_utf8(kvedge_tokenizer_t *t)
{
    static const char *const bad[] = {
        "\xff",
        "abc\xff"
        "def",
        "\xe4\xb8",
        "\xe4\xb8"
        "a",
        "\xc0\xaf",
        "\xed\xa0\x80",
        "\x80\x80\x80",
        "\xf4\x90\x80\x80",
        " \xfe  \xff\xff x",
        "'\xffs",
        "\xf0\x9f\x98",
        "caf\xc3",
        "\xc3\xa9\xa9",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n;
        free(s_round_trip(t, bad[i], strlen(bad[i]), &n));
    }
    /* "a\xffb": a, the token of byte 0xff ("ÿ"), b. */
    size_t n;
    int32_t *ids = s_round_trip(t,
                                "a\xff"
                                "b",
                                3, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], kvedge_tokenizer_token_id(t, "a"));
    assert_int_equal(ids[1], kvedge_tokenizer_token_id(t, "\xc3\xbf"));
    assert_int_equal(ids[2], kvedge_tokenizer_token_id(t, "b"));
    free(ids);
    /* Random bytes, and random mixes of valid multi-byte characters and stray bytes. */
    srand(7);
    static const char *const parts[] = {
        "a",  " ", "\n", "\xc3\xa9",     "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
        "'s", "1", "!",  "\xe2\x80\x8d", "\xef\xbb\xbf", "\xc2\xa0"};
    char buf[4096];
    for (int round = 0; round < 200; round++) {
        size_t len = 0;
        while (len < sizeof buf - 8) {
            if (round % 2) {
                buf[len++] = (char)(rand() & 0xff);
            } else if (rand() % 5 == 0) {
                buf[len++] = (char)(0x80 + rand() % 0x80);
            } else {
                const char *p = parts[rand() % (sizeof parts / sizeof parts[0])];
                memcpy(buf + len, p, strlen(p));
                len += strlen(p);
            }
        }
        free(s_round_trip(t, buf, len, &n));
    }
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_kjv_fixture();
    s_invalid_utf8(t);
    kvedge_tokenizer_destroy(&t);
}

static void test_invalid_utf8_gpt2(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_gpt2();
    if (!t)
        skip();
    s_invalid_utf8(t);
    kvedge_tokenizer_destroy(&t);
}

/* ---------------------------------------------------------------- kjv */

/* The trained vocabulary (models/kjv) gives the ids of scripts/train_models.py's Tokenizer, and
 * the same vocabulary as tokenizer.json (pairs, and "a b" strings) gives the same ids. */
static void test_kjv(void **state)
{
    (void)state;
    size_t len;
    char *json = s_read(S_FIX "/kjv_heldout.json", &len);
    assert_non_null(json);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(root, "ids");
    assert_true(cJSON_IsString(text) && cJSON_IsArray(want));
    size_t tl = strlen(text->valuestring), n;
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";

    /* tokenizer.json, merges as pairs; and the folder that holds only it. */
    kvedge_tokenizer_t *t = s_kjv_fixture();
    assert_int_equal(kvedge_tokenizer_vocab_size(t), 4096);
    assert_int_equal(kvedge_tokenizer_token_id(t, "</s>"), 2);
    assert_int_equal(kvedge_tokenizer_token_id(t, "<s>"), 0);
    int32_t *ids = s_round_trip(t, text->valuestring, tl, &n);
    s_assert_ids("kjv tokenizer.json", ids, n, want);
    free(ids);
    kvedge_tokenizer_destroy(&t);
    assert_int_equal(kvedge_tokenizer_load_dir(S_FIX "/kjv", &t, why, sizeof why), KVEDGE_OK);
    ids = s_round_trip(t, text->valuestring, tl, &n);
    s_assert_ids("kjv folder with tokenizer.json", ids, n, want);
    free(ids);
    kvedge_tokenizer_destroy(&t);

    /* The same, merges as "a b" strings (the older tokenizer.json form). */
    char *tj = s_read(S_FIX "/kjv/tokenizer.json", &len);
    cJSON *doc = cJSON_Parse(tj);
    assert_non_null(doc);
    cJSON *merges =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "model"), "merges");
    cJSON *strs = cJSON_CreateArray();
    for (const cJSON *m = merges->child; m; m = m->next) {
        char line[2100];
        snprintf(line, sizeof line, "%s %s", m->child->valuestring, m->child->next->valuestring);
        cJSON_AddItemToArray(strs, cJSON_CreateString(line));
    }
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(doc, "model"), "merges",
                                           strs);
    char *out = cJSON_PrintUnformatted(doc);
    char path[512];
    s_write(s_path("strings.json", path, sizeof path), out, strlen(out));
    assert_int_equal(kvedge_tokenizer_load_json(path, &t, why, sizeof why), KVEDGE_OK);
    ids = s_round_trip(t, text->valuestring, tl, &n);
    s_assert_ids("kjv tokenizer.json with string merges", ids, n, want);
    free(ids);
    kvedge_tokenizer_destroy(&t);
    unlink(path);
    free(out);
    cJSON_Delete(doc);
    free(tj);

    /* models/kjv itself: vocab.json + merges.txt, by paths and as a folder. */
    if (access(KVEDGE_MODELS "/kjv/vocab.json", R_OK) == 0) {
        int rc = kvedge_tokenizer_load(KVEDGE_MODELS "/kjv/vocab.json",
                                       KVEDGE_MODELS "/kjv/merges.txt", &t, why, sizeof why);
        if (rc != KVEDGE_OK)
            print_message("%s\n", why);
        assert_int_equal(rc, KVEDGE_OK);
        assert_int_equal(kvedge_tokenizer_vocab_size(t), 4096);
        ids = s_round_trip(t, text->valuestring, tl, &n);
        s_assert_ids("models/kjv vocab.json + merges.txt", ids, n, want);
        free(ids);
        kvedge_tokenizer_destroy(&t);
        assert_int_equal(kvedge_tokenizer_load_dir(KVEDGE_MODELS "/kjv", &t, why, sizeof why),
                         KVEDGE_OK);
        ids = s_round_trip(t, text->valuestring, tl, &n);
        s_assert_ids("models/kjv folder", ids, n, want);
        free(ids);
        kvedge_tokenizer_destroy(&t);
        print_message("kjv: %zu ids of %zu bytes equal to the Python encoder's (models/kjv, "
                      "tokenizer.json)\n",
                      n, tl);
    } else {
        print_message("models/kjv not found: checked the tokenizer.json fixture only\n");
    }
    cJSON_Delete(root);
    free(json);
}

/* The Llama pair's tokenizer (models/kjv/llama/tokenizer.json: the same vocabulary with Llama
 * 3's Split regex, ByteLevel without its own, ignore_merges, a template that puts <s> first)
 * gives the ids scripts/train_models.py trained the pair on; its two model folders hold the
 * same file. */
static void test_kjv_llama(void **state)
{
    (void)state;
    size_t len, n;
    char *json = s_read(S_FIX "/kjv_llama_heldout.json", &len);
    assert_non_null(json);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(root, "ids");
    assert_true(cJSON_IsString(text) && cJSON_IsArray(want));
    assert_int_equal(want->child->valueint, 0); /* <s> */
    static const char *const paths[] = {KVEDGE_MODELS "/kjv/llama/tokenizer.json",
                                        KVEDGE_MODELS "/kjv/llama/cloud",
                                        KVEDGE_MODELS "/kjv/llama/edge"};
    for (size_t p = 0; p < sizeof paths / sizeof *paths; p++) {
        kvedge_tokenizer_t *t = NULL;
        char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
        int rc = p ? kvedge_tokenizer_load_dir(paths[p], &t, why, sizeof why)
                   : kvedge_tokenizer_load_json(paths[p], &t, why, sizeof why);
        if (rc != KVEDGE_OK)
            print_message("%s: %s\n", paths[p], why);
        assert_int_equal(rc, KVEDGE_OK);
        assert_int_equal(kvedge_tokenizer_bos_id(t), 0);
        int32_t *ids = NULL;
        assert_int_equal(kvedge_tokenizer_encode_ex(t, text->valuestring, strlen(text->valuestring),
                                                    KVEDGE_TOKENIZER_TEMPLATE, &ids, &n),
                         KVEDGE_OK);
        s_assert_ids(paths[p], ids, n, want);
        free(ids);
        /* Without the template, the same ids less the <s>. */
        ids = s_round_trip(t, text->valuestring, strlen(text->valuestring), &n);
        assert_int_equal(n + 1, (size_t)cJSON_GetArraySize(want));
        assert_int_equal(ids[0], want->child->next->valueint);
        free(ids);
        kvedge_tokenizer_destroy(&t);
    }
    print_message("kjv llama: %zu ids equal to the Python encoder's\n", n + 1);
    cJSON_Delete(root);
    free(json);
}

/* ---------------------------------------------------------------- merges, by hand */

/* A vocabulary of the 256 byte tokens plus extra, as vocab.json text (caller frees). The
 * byte tokens take ids 0..255 in byte order; extra tokens follow. */
static char *s_vocab_json(const char *const *extra, size_t n_extra)
{
    cJSON *v = cJSON_CreateObject();
    int id = 0;
    for (int b = 0; b < 256; b++) {
        /* GPT-2's byte map, as in tokenizer.c. */
        static int next = 256;
        int cp;
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (b == 0)
            next = 256;
        cp = printable ? b : next++;
        char s[3] = {0};
        if (cp < 0x80) {
            s[0] = (char)cp;
        } else {
            s[0] = (char)(0xC0 | cp >> 6);
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
        cJSON_AddNumberToObject(v, s, id++);
    }
    for (size_t i = 0; i < n_extra; i++)
        cJSON_AddNumberToObject(v, extra[i], id++);
    char *s = cJSON_PrintUnformatted(v);
    cJSON_Delete(v);
    return s;
}

static kvedge_tokenizer_t *s_small(const char *const *extra, size_t n_extra, const char *merges)
{
    char *v = s_vocab_json(extra, n_extra);
    kvedge_tokenizer_t *t = NULL;
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    int rc = kvedge_tokenizer_parse(v, strlen(v), merges, strlen(merges), &t, why, sizeof why);
    if (rc != KVEDGE_OK)
        print_message("%s\n", why);
    assert_int_equal(rc, KVEDGE_OK);
    free(v);
    return t;
}

/* GPT-2 merges every occurrence of the best pair in one pass, and only then looks at the pairs
 * that pass made: with "ab a" ranked before "a b", "ababa" is [ab, aba] (as GPT-2's Python and
 * JavaScript encoders give), not [aba, b, a] as merging one pair at a time would. */
static void test_merge_passes(void **state)
{
    (void)state;
    static const char *const extra[] = {"ab", "aba", "aa", "aaa", "aaaa"};
    kvedge_tokenizer_t *t = s_small(extra, 5, "#version: 0.2\nab a\na b\na a\naa aa\n");
    int32_t ab = kvedge_tokenizer_token_id(t, "ab"), aba = kvedge_tokenizer_token_id(t, "aba");
    int32_t aa = kvedge_tokenizer_token_id(t, "aa"), a4 = kvedge_tokenizer_token_id(t, "aaaa");
    int32_t a = kvedge_tokenizer_token_id(t, "a");
    assert_int_equal(kvedge_tokenizer_vocab_size(t), 261);
    size_t n;
    int32_t *ids = s_round_trip(t, "ababa", 5, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], ab);
    assert_int_equal(ids[1], aba);
    free(ids);
    /* Overlaps go left to right: aaaaa -> [aa, aa, a] -> [aaaa, a]. */
    ids = s_round_trip(t, "aaaaa", 5, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], a4);
    assert_int_equal(ids[1], a);
    free(ids);
    ids = s_round_trip(t, "aaa", 3, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], aa);
    assert_int_equal(ids[1], a);
    free(ids);
    /* A long word (not cached, the heap's case): 40001 a's -> 10000 aaaa and one a. */
    size_t len = 40001;
    char *w = malloc(len);
    memset(w, 'a', len);
    ids = s_round_trip(t, w, len, &n);
    assert_int_equal(n, 10001);
    for (size_t i = 0; i < 10000; i++)
        assert_int_equal(ids[i], a4);
    assert_int_equal(ids[10000], a);
    free(ids);
    free(w);
    kvedge_tokenizer_destroy(&t);
}

/* ---------------------------------------------------------------- degenerate input */

static void test_degenerate(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_kjv_fixture();
    int32_t *ids = (int32_t *)&ids;
    size_t n = 99;
    assert_int_equal(kvedge_tokenizer_encode(t, "", 0, &ids, &n), KVEDGE_OK);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_int_equal(kvedge_tokenizer_encode(t, NULL, 0, &ids, &n), KVEDGE_OK);
    assert_int_equal(kvedge_tokenizer_encode(t, NULL, 3, &ids, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tokenizer_encode(NULL, "a", 1, &ids, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tokenizer_encode(t, "a", 1, NULL, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tokenizer_encode(t, "a", 1, &ids, NULL), KVEDGE_EINVAL);
    /* NUL is a character like any other. */
    ids = s_round_trip(t, "a\0b\0\0", 5, &n);
    assert_true(n >= 3);
    free(ids);

    char *text = (char *)&text;
    size_t len = 99;
    assert_int_equal(kvedge_tokenizer_decode(t, NULL, 0, &text, &len), KVEDGE_OK);
    assert_non_null(text);
    assert_int_equal(len, 0);
    assert_string_equal(text, "");
    free(text);
    const int32_t bad[][2] = {{5, -1}, {5, 4096}, {5, INT32_MAX}};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvedge_tokenizer_decode(t, bad[i], 2, &text, &len), KVEDGE_EINVAL);
        assert_null(text);
    }
    assert_int_equal(kvedge_tokenizer_decode(t, NULL, 1, &text, &len), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tokenizer_decode(NULL, bad[0], 1, &text, &len), KVEDGE_EINVAL);
    /* Special tokens decode to their text. */
    const int32_t eos[] = {2, 0};
    assert_int_equal(kvedge_tokenizer_decode(t, eos, 2, &text, &len), KVEDGE_OK);
    assert_string_equal(text, "</s><s>");
    free(text);

    assert_int_equal(kvedge_tokenizer_token_id(t, "no such token"), -1);
    assert_int_equal(kvedge_tokenizer_token_id(t, ""), -1);
    assert_int_equal(kvedge_tokenizer_token_id(t, NULL), -1);
    assert_int_equal(kvedge_tokenizer_token_id(NULL, "a"), -1);
    assert_int_equal(kvedge_tokenizer_vocab_size(NULL), 0);
    kvedge_tokenizer_destroy(&t);
    assert_null(t);
    kvedge_tokenizer_destroy(&t);
    kvedge_tokenizer_destroy(NULL);

    char why[KVEDGE_TOKENIZER_WHY_BYTES];
    assert_int_equal(kvedge_tokenizer_load(NULL, "x", &t, why, sizeof why), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tokenizer_load_json(NULL, &t, why, sizeof why), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tokenizer_load_dir(NULL, &t, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tokenizer_parse(NULL, 1, "", 0, &t, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_tokenizer_parse_json("{}", 2, NULL, NULL, 0), KVEDGE_EINVAL);
}

/* ---------------------------------------------------------------- threads */

typedef struct {
    kvedge_tokenizer_t *t;
    const char *text;
    size_t len;
    const int32_t *want;
    size_t n;
    int bad;
} s_job_t;

static void *s_worker(void *arg)
{
    s_job_t *j = arg;
    for (int r = 0; r < 20; r++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (kvedge_tokenizer_encode(j->t, j->text, j->len, &ids, &n) != KVEDGE_OK || n != j->n ||
            memcmp(ids, j->want, n * sizeof *ids) != 0)
            j->bad++;
        free(ids);
    }
    return NULL;
}

/* Threads encoding at once on one tokenizer (sharing its cache) get what one thread gets. */
static void test_threads(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_kjv_fixture();
    size_t len;
    char *json = s_read(S_FIX "/kjv_heldout.json", &len);
    cJSON *root = cJSON_Parse(json);
    const char *text = cJSON_GetObjectItemCaseSensitive(root, "text")->valuestring;
    enum { S_THREADS = 4 };
    s_job_t jobs[S_THREADS];
    int32_t *want[S_THREADS];
    pthread_t th[S_THREADS];
    for (int i = 0; i < S_THREADS; i++) {
        /* Different slices, so the threads fill and read the cache differently. */
        size_t off = (size_t)i * 1000, tl = strlen(text) - off;
        jobs[i] = (s_job_t){.t = t, .text = text + off, .len = tl};
        assert_int_equal(kvedge_tokenizer_encode(t, jobs[i].text, tl, &want[i], &jobs[i].n),
                         KVEDGE_OK);
        jobs[i].want = want[i];
    }
    kvedge_tokenizer_destroy(&t); /* a fresh tokenizer: an empty cache */
    t = s_kjv_fixture();
    for (int i = 0; i < S_THREADS; i++) {
        jobs[i].t = t;
        assert_int_equal(pthread_create(&th[i], NULL, s_worker, &jobs[i]), 0);
    }
    for (int i = 0; i < S_THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].bad, 0);
        free(want[i]);
    }
    kvedge_tokenizer_destroy(&t);
    cJSON_Delete(root);
    free(json);
}

/* ---------------------------------------------------------------- a megabyte */

static void s_time(kvedge_tokenizer_t *t, const char *what, const char *text, size_t len)
{
    double t0 = s_now_s();
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(kvedge_tokenizer_encode(t, text, len, &ids, &n), KVEDGE_OK);
    double dt = s_now_s() - t0;
    char *back = NULL;
    size_t blen = 0;
    assert_int_equal(kvedge_tokenizer_decode(t, ids, n, &back, &blen), KVEDGE_OK);
    assert_int_equal(blen, len);
    assert_memory_equal(back, text, len);
    print_message("encode %-34s %7zu bytes -> %7zu ids in %7.1f ms (%.1f MB/s)\n", what, len, n,
                  dt * 1e3, (double)len / 1e6 / (dt > 0 ? dt : 1e-9));
    free(back);
    free(ids);
}

/* 1 MB of prose, of one word, of spaces, of random bytes: each completes (times printed, not
 * asserted). */
static void test_megabyte(void **state)
{
    (void)state;
    enum { S_MB = 1 << 20 };
    kvedge_tokenizer_t *g = s_gpt2();
    kvedge_tokenizer_t *t = g ? g : s_kjv_fixture();
    const char *name = g ? "(GPT-2)" : "(kjv)";
    char *buf = malloc(S_MB);
    assert_non_null(buf);
    /* Prose: the fixture corpus, over and over. */
    size_t len = 0;
    DIR *d = opendir(S_FIX "/texts");
    assert_non_null(d);
    struct dirent *e;
    char *corpus = NULL;
    size_t clen = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/texts/%s", S_FIX, e->d_name);
        size_t fl;
        char *f = s_read(path, &fl);
        assert_non_null(f);
        corpus = realloc(corpus, clen + fl);
        memcpy(corpus + clen, f, fl);
        clen += fl;
        free(f);
    }
    closedir(d);
    while (len < S_MB) {
        size_t k = clen < S_MB - len ? clen : S_MB - len;
        memcpy(buf + len, corpus, k);
        len += k;
    }
    char what[64];
    snprintf(what, sizeof what, "fixture texts %s", name);
    s_time(t, what, buf, S_MB);
    memset(buf, 'x', S_MB);
    snprintf(what, sizeof what, "one word %s", name);
    s_time(t, what, buf, S_MB);
    memset(buf, ' ', S_MB);
    snprintf(what, sizeof what, "spaces %s", name);
    s_time(t, what, buf, S_MB);
    srand(11);
    for (size_t i = 0; i < S_MB; i++)
        buf[i] = (char)(rand() & 0xff);
    snprintf(what, sizeof what, "random bytes %s", name);
    s_time(t, what, buf, S_MB);
    free(corpus);
    free(buf);
    kvedge_tokenizer_destroy(&t);
}

/* ---------------------------------------------------------------- refusals */

/* The 256 byte tokens and "a", "b", "ab" as vocab.json. */
static char *s_base_vocab(void)
{
    static const char *const extra[] = {"ab"};
    return s_vocab_json(extra, 1);
}

/* Loads vocab (text) + merges (text) from files, expecting rc, a NULL *out and a reason naming
 * the file that is wrong and each of the strings in must (NULL-terminated). */
static void s_refused(const char *vocab, const char *merges, int rc, const char *file,
                      const char *must1, const char *must2)
{
    char vp[256], mp[256], why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    s_write(s_path("vocab.json", vp, sizeof vp), vocab, strlen(vocab));
    s_write(s_path("merges.txt", mp, sizeof mp), merges, strlen(merges));
    kvedge_tokenizer_t *t = (kvedge_tokenizer_t *)&t;
    int got = kvedge_tokenizer_load(vp, mp, &t, why, sizeof why);
    if (got != rc || !strstr(why, file) || (must1 && !strstr(why, must1)) ||
        (must2 && !strstr(why, must2))) {
        print_message("got %d (%s), want %d naming %s, %s, %s\n", got, why, rc, file,
                      must1 ? must1 : "", must2 ? must2 : "");
        fail();
    }
    if (rc == KVEDGE_OK)
        kvedge_tokenizer_destroy(&t);
    assert_null(t);
}

static void s_refused_json(const char *json, int rc, const char *must1, const char *must2)
{
    char p[256], why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    s_write(s_path("tokenizer.json", p, sizeof p), json, strlen(json));
    kvedge_tokenizer_t *t = (kvedge_tokenizer_t *)&t;
    int got = kvedge_tokenizer_load_json(p, &t, why, sizeof why);
    if (got != rc || !strstr(why, p) || (must1 && !strstr(why, must1)) ||
        (must2 && !strstr(why, must2))) {
        print_message("got %d (%s), want %d naming %s, %s, %s\n", got, why, rc, p,
                      must1 ? must1 : "", must2 ? must2 : "");
        fail();
    }
    assert_null(t);
}

static void test_refuse_vocab(void **state)
{
    (void)state;
    char *v = s_base_vocab();
    /* The base files load. */
    char vp[256], mp[256], why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    s_write(s_path("vocab.json", vp, sizeof vp), v, strlen(v));
    s_write(s_path("merges.txt", mp, sizeof mp), "#version: 0.2\na b\n", 18);
    kvedge_tokenizer_t *t = NULL;
    assert_int_equal(kvedge_tokenizer_load(vp, mp, &t, why, sizeof why), KVEDGE_OK);
    kvedge_tokenizer_destroy(&t);

    const char *m = "a b\n";
    s_refused("{\"a\": 1,", m, KVEDGE_ECORRUPT, "vocab.json", "invalid JSON",
              "byte 7 (line 1, column 8)");
    s_refused("{\"a\": 1}\n{", m, KVEDGE_ECORRUPT, "vocab.json", "trailing bytes", "line 2");
    s_refused("", m, KVEDGE_ECORRUPT, "vocab.json", "invalid JSON", "byte 0");
    s_refused("[1, 2]", m, KVEDGE_ECORRUPT, "vocab.json", "not a JSON object", NULL);
    s_refused("{}", m, KVEDGE_ECORRUPT, "vocab.json", "no tokens", NULL);
    s_refused("{\"a\": 1.5}", m, KVEDGE_ECORRUPT, "vocab.json", "key \"a\"", "not an integer");
    s_refused("{\"a\": \"1\"}", m, KVEDGE_ECORRUPT, "vocab.json", "key \"a\"", "not a number");
    s_refused("{\"a\": -1}", m, KVEDGE_ECORRUPT, "vocab.json", "key \"a\"", "id -1");
    s_refused("{\"a\": 1048576}", m, KVEDGE_ECORRUPT, "vocab.json", "key \"a\"", "0..1048575");
    s_refused("{\"a\": 1e300}", m, KVEDGE_ECORRUPT, "vocab.json", "key \"a\"", NULL);
    s_refused("{\"\": 1}", m, KVEDGE_ECORRUPT, "vocab.json", "key \"\"", "empty token");
    s_refused("{\"a\\u00e9\xff\": 1}", m, KVEDGE_ECORRUPT, "vocab.json", "not valid UTF-8",
              "byte 3");
    s_refused("{\"a\": 1, \"b\": 2, \"a\": 3}", m, KVEDGE_ECORRUPT, "vocab.json",
              "key \"a\" appears twice", NULL);
    s_refused("{\"a\": 7, \"b\": 7}", m, KVEDGE_ECORRUPT, "vocab.json", "key \"a\" and key \"b\"",
              "both have id 7");
    /* A token over the length bound. */
    size_t big = KVEDGE_TOKENIZER_TOKEN_MAX_BYTES + 1;
    char *longv = malloc(big + 16);
    longv[0] = '{';
    longv[1] = '"';
    memset(longv + 2, 'x', big);
    strcpy(longv + 2 + big, "\": 1}");
    s_refused(longv, m, KVEDGE_ETOOBIG, "vocab.json", "1025 bytes", "over the limit of 1024");
    free(longv);
    /* No token for byte 0x00 ("Ā"): the vocabulary without its first entry. */
    char *nob = strdup(v);
    char *p = strstr(nob, "\"\xc4\x80\":");
    assert_non_null(p);
    memcpy(p, "\"zz\"", 4); /* as many bytes as "\xc4\x80" with its quotes */
    s_refused(nob, m, KVEDGE_ECORRUPT, "vocab.json", "no token for byte 0x00", NULL);
    free(nob);
    /* More tokens than KVEDGE_TOKENIZER_VOCAB_MAX. */
    size_t count = KVEDGE_TOKENIZER_VOCAB_MAX + 1;
    char *huge = malloc(count * 20 + 16);
    size_t k = 0;
    huge[k++] = '{';
    for (size_t i = 0; i < count; i++)
        k += (size_t)sprintf(huge + k, "%s\"t%zu\":%zu", i ? "," : "", i, i % 1000);
    strcpy(huge + k, "}");
    s_refused(huge, m, KVEDGE_ETOOBIG, "vocab.json", "more than 1048576 tokens", NULL);
    free(huge);
    /* A missing file: an I/O error naming it. */
    assert_int_equal(kvedge_tokenizer_load(S_FIX "/nonexistent.json", mp, &t, why, sizeof why),
                     KVEDGE_EIO);
    assert_non_null(strstr(why, S_FIX "/nonexistent.json"));
    assert_int_equal(kvedge_tokenizer_load(s_tmp, mp, &t, why, sizeof why), KVEDGE_EIO);
    assert_non_null(strstr(why, "is a directory"));
    free(v);
}

static void test_refuse_merges(void **state)
{
    (void)state;
    char *v = s_base_vocab();
    s_refused(v, "#version: 0.2\na b\nab\n", KVEDGE_ECORRUPT,
              "merges.txt:3:", "expected two tokens separated by one space", NULL);
    s_refused(v, "a b c\n", KVEDGE_ECORRUPT, "merges.txt:1:", "expected two tokens", NULL);
    s_refused(v, "a  b\n", KVEDGE_ECORRUPT, "merges.txt:1:", "expected two tokens", NULL);
    s_refused(v, " a\n", KVEDGE_ECORRUPT, "merges.txt:1:", "expected two tokens", NULL);
    s_refused(v, "#version: 0.2\na b\nzz b\n", KVEDGE_ECORRUPT,
              "merges.txt:3:", "token \"zz\" is not in the vocabulary", NULL);
    s_refused(v, "a b\nb a\n", KVEDGE_ECORRUPT, "merges.txt:2:", "\"b\" + \"a\"",
              "merged token is not in the vocabulary");
    s_refused(v, "#version: 0.2\na b\na b\n", KVEDGE_ECORRUPT, "merges.txt:3:", "repeats line 2",
              NULL);
    s_refused(v, "a b\n\nab a\n", KVEDGE_ECORRUPT, "merges.txt:2:", "empty line", NULL);
    s_refused(v, "a b\r\n\r\n\r\n", KVEDGE_OK, "", NULL, NULL); /* CRLF, blank lines at the end */
    /* More merges than KVEDGE_TOKENIZER_MERGES_MAX: refused before any is read. */
    size_t lines = KVEDGE_TOKENIZER_MERGES_MAX + 1;
    char *many = malloc(lines + 1);
    memset(many, '\n', lines);
    many[lines] = '\0';
    s_refused(v, many, KVEDGE_ETOOBIG, "merges.txt", "more than 2097152 merges", NULL);
    free(many);
    /* A file over KVEDGE_TOKENIZER_FILE_MAX_BYTES (sparse: no disk used). */
    char mp[256], vp[256], why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    s_path("big.txt", mp, sizeof mp);
    FILE *f = fopen(mp, "wb");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), (off_t)KVEDGE_TOKENIZER_FILE_MAX_BYTES + 1), 0);
    fclose(f);
    s_write(s_path("vocab.json", vp, sizeof vp), v, strlen(v));
    kvedge_tokenizer_t *t = (kvedge_tokenizer_t *)&t;
    assert_int_equal(kvedge_tokenizer_load(vp, mp, &t, why, sizeof why), KVEDGE_ETOOBIG);
    assert_null(t);
    assert_non_null(strstr(why, mp));
    assert_non_null(strstr(why, "over the limit"));
    assert_int_equal(kvedge_tokenizer_load_json(mp, &t, why, sizeof why), KVEDGE_ETOOBIG);
    unlink(mp);
    free(v);
}

static void test_refuse_json(void **state)
{
    (void)state;
    char *v = s_base_vocab();
    char *doc = malloc(strlen(v) + 512);
    /* The base document loads, with string and pair merges mixed. */
    sprintf(doc, "{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": [\"a b\"]}}", v);
    char p[256], why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    s_write(s_path("tokenizer.json", p, sizeof p), doc, strlen(doc));
    kvedge_tokenizer_t *t = NULL;
    assert_int_equal(kvedge_tokenizer_load_json(p, &t, why, sizeof why), KVEDGE_OK);
    kvedge_tokenizer_destroy(&t);

    s_refused_json("{\"model\": {", KVEDGE_ECORRUPT, "invalid JSON", "byte 10 (line 1, column 11)");
    s_refused_json("{\n \"model\": [}\n", KVEDGE_ECORRUPT, "invalid JSON", "line 2");
    s_refused_json("{}", KVEDGE_ECORRUPT, "no \"model\" object", NULL);
    s_refused_json("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", KVEDGE_ECORRUPT,
                   "model.type \"WordPiece\" is not supported", "only BPE");
    s_refused_json("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", KVEDGE_ECORRUPT,
                   "model.type \"Unigram\" is not supported", NULL);
    s_refused_json("{\"model\": {\"merges\": []}}", KVEDGE_ECORRUPT, "model.vocab",
                   "not a JSON object");
    s_refused_json("{\"model\": {\"vocab\": {\"x\": 0.5}}}", KVEDGE_ECORRUPT, "model.vocab[\"x\"]",
                   "not an integer");
    sprintf(doc, "{\"model\": {\"vocab\": %s, \"merges\": [\"a b\", [\"ab\"], \"b a\"]}}", v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "model.merges[1]", "expected \"a b\" or [\"a\", \"b\"]");
    sprintf(doc, "{\"model\": {\"vocab\": %s, \"merges\": [[\"a\", \"b\"], \"zz b\"]}}", v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "model.merges[1]", "token \"zz\" is not in");
    sprintf(doc, "{\"model\": {\"vocab\": %s, \"merges\": [\"a b\", [\"a\", \"b\"]]}}", v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "model.merges[1]", "repeats model.merges index 0");
    sprintf(doc, "{\"model\": {\"vocab\": %s, \"merges\": [\"a  b\"]}}", v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "model.merges[0]", "expected two tokens");
    sprintf(doc, "{\"model\": {\"vocab\": %s, \"merges\": {}}}", v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "model.merges is not an array", NULL);
    sprintf(doc, "{\"model\": {\"dropout\": 0.1, \"vocab\": %s, \"merges\": []}}", v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "model.dropout", NULL);
    sprintf(doc, "{\"model\": {\"end_of_word_suffix\": \"</w>\", \"vocab\": %s, \"merges\": []}}",
            v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "model.end_of_word_suffix", NULL);
    sprintf(doc, "{\"normalizer\": {\"type\": \"Lowercase\"}, \"model\": {\"vocab\": %s}}", v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "normalizer type \"Lowercase\" is not supported",
                   "only NFC");
    sprintf(doc, "{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"vocab\": %s}}", v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "pre_tokenizer type \"Whitespace\" is not supported",
                   "ByteLevel");
    sprintf(doc,
            "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true}, "
            "\"model\": {\"vocab\": %s}}",
            v);
    s_refused_json(doc, KVEDGE_ECORRUPT, "pre_tokenizer.add_prefix_space", NULL);

    /* A folder with neither form; one with only vocab.json falls back to tokenizer.json. */
    assert_int_equal(kvedge_tokenizer_load_dir(S_FIX "/texts", &t, why, sizeof why),
                     KVEDGE_ENOTFOUND);
    assert_non_null(strstr(why, S_FIX "/texts"));
    assert_null(t);
    free(doc);
    free(v);
}

/* ---------------------------------------------------------------- Llama 3 / Qwen2 form */

/* Llama 3's pre-tokenizer regex, as its tokenizer.json writes it (JSON-escaped). */
#define S_LLAMA3_RE                                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "         \
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+"

/* A tokenizer.json of Llama 3's form over the 256 byte tokens (id = byte) and "ab", "abc",
 * "Ġab", "123", "'S", "!" U+180E (256..261), with
 * merges "a b", "Ġ ab"; parts may be replaced: NORM (the normalizer), PRE (the pre_tokenizer),
 * IGN (ignore_merges), ADDED (added_tokens), POST (post_processor). Caller frees. */
static char *s_llama_doc(const char *norm, const char *pre, const char *ign, const char *added,
                         const char *post)
{
    /* "!" U+180E through GPT-2's byte map: "!" "á" "ł" "İ" (bytes 21 E1 A0 8E). */
    static const char *const extra[] = {"ab",  "abc", "\u0120ab",
                                        "123", "'S",  "!\xc3\xa1\xc5\x82\xc4\xb0"};
    char *v = s_vocab_json(extra, 6);
    static const char def_pre[] =
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
        "{\"Regex\": \"" S_LLAMA3_RE "\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
        "\"use_regex\": false}]}";
    static const char def_added[] =
        "[{\"id\": 300, \"content\": \"<|bos|>\", \"single_word\": false, \"lstrip\": false, "
        "\"rstrip\": false, \"normalized\": false, \"special\": true}, "
        "{\"id\": 301, \"content\": \"<|bos|>x\", \"special\": true}, "
        "{\"id\": 302, \"content\": \"<x>\", \"normalized\": false, \"special\": false}]";
    static const char def_post[] =
        "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\", \"trim_offsets\": "
        "false}, {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
        "\"<|bos|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
        "\"special_tokens\": {\"<|bos|>\": {\"id\": \"<|bos|>\", \"ids\": [300], \"tokens\": "
        "[\"<|bos|>\"]}}}]}";
    size_t cap = strlen(v) + 8192;
    char *doc = malloc(cap);
    assert_non_null(doc);
    snprintf(doc, cap,
             "{\"version\": \"1.0\", \"added_tokens\": %s, \"normalizer\": %s, "
             "\"pre_tokenizer\": %s, \"post_processor\": %s, \"decoder\": {\"type\": "
             "\"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"dropout\": null, "
             "\"byte_fallback\": false, \"ignore_merges\": %s, \"vocab\": %s, \"merges\": "
             "[\"a b\", \"\xc4\xa0 ab\"]}}",
             added ? added : def_added, norm ? norm : "null", pre ? pre : def_pre,
             post ? post : def_post, ign ? ign : "true", v);
    free(v);
    return doc;
}

static kvedge_tokenizer_t *s_llama_load(const char *doc)
{
    char why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    kvedge_tokenizer_t *t = NULL;
    int rc = kvedge_tokenizer_parse_json(doc, strlen(doc), &t, why, sizeof why);
    if (rc != KVEDGE_OK)
        print_message("%s\n", why);
    assert_int_equal(rc, KVEDGE_OK);
    return t;
}

static void s_want(kvedge_tokenizer_t *t, const char *text, unsigned flags, const int32_t *want,
                   size_t wn)
{
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(kvedge_tokenizer_encode_ex(t, text, strlen(text), flags, &ids, &n), KVEDGE_OK);
    if (n != wn || memcmp(ids, want, n * sizeof *ids) != 0) {
        print_message("\"%s\" (flags %u): %zu ids, want %zu:", text, flags, n, wn);
        for (size_t i = 0; i < n; i++)
            print_message(" %d", ids[i]);
        print_message("\n");
        fail();
    }
    free(ids);
}

/* The Llama 3 form without the network (llama.cpp's own cases are test_tokenizer_llama): the
 * Split regex (digits in threes, "'S" case-insensitive), ignore_merges, added tokens matched
 * before the regex (longest first, special ones only when allowed), the template's BOS, NFC. */
static void test_llama_form(void **state)
{
    (void)state;
    enum { AB = 256, ABC = 257, GAB = 258, N123 = 259, QS = 260, BANG180E = 261 };
    char *doc = s_llama_doc(NULL, NULL, NULL, NULL, NULL);
    kvedge_tokenizer_t *t = s_llama_load(doc);
    free(doc);
    assert_int_equal(kvedge_tokenizer_vocab_size(t), 303);
    assert_int_equal(kvedge_tokenizer_token_id(t, "<|bos|>"), 300);
    assert_int_equal(kvedge_tokenizer_bos_id(t), 300);
    assert_int_equal(kvedge_tokenizer_eos_id(t), -1);
    assert_int_equal(kvedge_tokenizer_token_id(t, "<x>"), 302);
    /* "abc" is in the vocabulary whole: one id, though no merge makes it (ignore_merges). */
    s_want(t, "abc abc", 0, (const int32_t[]){ABC, GAB, 'c'}, 3);
    /* Digits in groups of three; "'S" is one piece, as "'s" is. */
    s_want(t, "12345", 0, (const int32_t[]){N123, '4', '5'}, 3);
    s_want(t, "ab'S", 0, (const int32_t[]){AB, QS}, 2);
    /* U+180E is not \s for Hugging Face (Oniguruma): "!" U+180E is one piece of
     * ` ?[^\s\p{L}\p{N}]+`, where PCRE2's own \s would cut it in two. */
    s_want(t, "!\xe1\xa0\x8e", 0, (const int32_t[]){BANG180E}, 1);
    /* Specials: text unless allowed; then the longest ("<|bos|>x") wins. */
    s_want(t, "<x>ab", 0, (const int32_t[]){302, AB}, 2);
    s_want(t, "<|bos|>xab", KVEDGE_TOKENIZER_SPECIAL, (const int32_t[]){301, AB}, 2);
    s_want(t, "<|bos|>ab", KVEDGE_TOKENIZER_SPECIAL | KVEDGE_TOKENIZER_TEMPLATE,
           (const int32_t[]){300, 300, AB}, 3);
    s_want(t, "ab", KVEDGE_TOKENIZER_TEMPLATE, (const int32_t[]){300, AB}, 2);
    s_want(t, "", KVEDGE_TOKENIZER_TEMPLATE, (const int32_t[]){300}, 1);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(kvedge_tokenizer_encode_ex(t, "<|bos|>ab", 9, 0, &ids, &n), KVEDGE_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(ids[i] < 300);
    char *back = NULL;
    size_t blen = 0;
    assert_int_equal(kvedge_tokenizer_decode(t, (const int32_t[]){300, 302, ABC}, 3, &back, &blen),
                     KVEDGE_OK);
    assert_string_equal(back, "<|bos|><x>abc");
    free(back);
    free(ids);
    /* Without the normalizer a decomposed "é" stays three bytes; with NFC it is two. */
    s_want(t, "e\xcc\x81", 0, (const int32_t[]){'e', 0xcc, 0x81}, 3);
    kvedge_tokenizer_destroy(&t);
    doc = s_llama_doc("{\"type\": \"NFC\"}", NULL, "false", NULL, NULL);
    t = s_llama_load(doc);
    free(doc);
    s_want(t, "e\xcc\x81", 0, (const int32_t[]){0xc3, 0xa9}, 2);
    /* Bytes that are not UTF-8 pass through the normalizer as they are. */
    s_want(t,
           "\xff"
           "e\xcc\x81",
           0, (const int32_t[]){0xff, 0xc3, 0xa9}, 3);
    /* ignore_merges false: "abc" is merged as far as the merges go. */
    s_want(t, "abc", 0, (const int32_t[]){AB, 'c'}, 2);
    kvedge_tokenizer_destroy(&t);
}

/* Each unsupported component of a tokenizer.json refused naming it; bad added tokens, templates
 * and regexes with clear reasons; nothing loaded. */
static void test_refuse_llama_json(void **state)
{
    (void)state;
    static const char split[] = "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, "
                                "\"behavior\": \"%s\", \"invert\": %s}";
    static const char bl[] = "{\"type\": \"ByteLevel\", \"use_regex\": %s}";
    char pre[1024], a[512], b[256];
    const struct {
        const char *norm, *pre, *ign, *added, *post;
        int rc;
        const char *must1, *must2;
    } cases[] = {
        {"{\"type\": \"Lowercase\"}", NULL, NULL, NULL, NULL, KVEDGE_ECORRUPT,
         "normalizer type \"Lowercase\" is not supported", NULL},
        {"{\"type\": \"Sequence\", \"normalizers\": []}", NULL, NULL, NULL, NULL, KVEDGE_ECORRUPT,
         "normalizer type \"Sequence\" is not supported", NULL},
        {"{\"kind\": \"NFC\"}", NULL, NULL, NULL, NULL, KVEDGE_ECORRUPT, "normalizer has no", NULL},
        {NULL, "{\"type\": \"Metaspace\", \"replacement\": \"_\"}", NULL, NULL, NULL,
         KVEDGE_ECORRUPT, "pre_tokenizer type \"Metaspace\" is not supported", NULL},
        {NULL,
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, "
         "{\"type\": \"ByteLevel\"}]}",
         NULL, NULL, NULL, KVEDGE_ECORRUPT, "pretokenizers[0] type \"Digits\" is not supported",
         NULL},
        {NULL, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\"}]}", NULL,
         NULL, NULL, KVEDGE_ECORRUPT, "pre_tokenizer.pretokenizers", "[Split, ByteLevel]"},
        {NULL, "{\"type\": \"ByteLevel\", \"use_regex\": false}", NULL, NULL, NULL, KVEDGE_ECORRUPT,
         "pre_tokenizer.use_regex false", NULL},
        {NULL,
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"String\": \" \"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", "
         "\"use_regex\": false}]}",
         NULL, NULL, NULL, KVEDGE_ECORRUPT, "pretokenizers[0].pattern", "Regex"},
        {NULL,
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"x\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\"}]}",
         NULL, NULL, NULL, KVEDGE_ECORRUPT, "pretokenizers[1].use_regex true", NULL},
        {NULL, NULL, NULL, "[{\"id\": 300, \"content\": \"\", \"special\": true}]", NULL,
         KVEDGE_ECORRUPT, "added_tokens[0].content: empty token", NULL},
        {NULL, NULL, NULL, "[{\"id\": 300, \"special\": true}]", NULL, KVEDGE_ECORRUPT,
         "added_tokens[0]", "\"content\""},
        {NULL, NULL, NULL, "[{\"id\": 97, \"content\": \"<s>\"}]", NULL, KVEDGE_ECORRUPT,
         "added_tokens[0]", "both have id 97"},
        {NULL, NULL, NULL, "[{\"id\": 300, \"content\": \"ab\"}]", NULL, KVEDGE_ECORRUPT,
         "added_tokens[0]", "model.vocab gives it 256"},
        {NULL, NULL, NULL,
         "[{\"id\": 300, \"content\": \"<s>\"}, {\"id\": 301, \"content\": "
         "\"<s>\"}]",
         NULL, KVEDGE_ECORRUPT, "added_tokens[1]", "appears twice"},
        {NULL, NULL, NULL, "[{\"id\": 300, \"content\": \"<s>\", \"lstrip\": true}]", NULL,
         KVEDGE_ECORRUPT, "added_tokens[0].lstrip: not supported", NULL},
        {NULL, NULL, NULL, "[{\"id\": 300, \"content\": \"<s>\", \"special\": 1}]", NULL,
         KVEDGE_ECORRUPT, "added_tokens[0].special", NULL},
        {NULL, NULL, NULL, "[{\"id\": -1, \"content\": \"<s>\"}]", NULL, KVEDGE_ECORRUPT,
         "added_tokens[0]: id -1", NULL},
        {NULL, NULL, NULL, "{}", NULL, KVEDGE_ECORRUPT, "added_tokens is not an array", NULL},
        {"{\"type\": \"NFC\"}", NULL, NULL,
         "[{\"id\": 300, \"content\": \"<s>\", \"normalized\": "
         "true}]",
         NULL, KVEDGE_ECORRUPT, "added_tokens[0].normalized", NULL},
        {NULL, NULL, NULL, NULL, "{\"type\": \"RobertaProcessing\"}", KVEDGE_ECORRUPT,
         "post_processor type \"RobertaProcessing\" is not supported", NULL},
        {NULL, NULL, NULL, NULL,
         "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"BertProcessing\"}]}",
         KVEDGE_ECORRUPT, "post_processor.processors[0] type \"BertProcessing\"", NULL},
        {NULL, NULL, NULL, NULL,
         "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
         "\"<|bos|>\"}}, "
         "{\"SpecialToken\": {\"id\": \"<|bos|>\"}}, {\"Sequence\": {\"id\": \"A\"}}], "
         "\"special_tokens\": {\"<|bos|>\": {\"ids\": [300]}}}",
         KVEDGE_ECORRUPT, "post_processor.single[1]", "more than one special token before"},
        {NULL, NULL, NULL, NULL,
         "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
         "\"<|bos|>\"}}, "
         "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}",
         KVEDGE_ECORRUPT, "special_tokens[\"<|bos|>\"] has not exactly one id", NULL},
        {NULL, NULL, NULL, NULL,
         "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
         "\"<|bos|>\"}}, "
         "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<|bos|>\": {\"ids\": [9999]}}}",
         KVEDGE_ECORRUPT, "id 9999 is not in the vocabulary", NULL},
        {NULL, NULL, NULL, NULL,
         "{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"B\"}}]}",
         KVEDGE_ECORRUPT, "post_processor.single[0]", "Sequence"},
        {NULL, NULL, NULL, NULL, "{\"type\": \"TemplateProcessing\", \"single\": []}",
         KVEDGE_ECORRUPT, "post_processor.single: no Sequence", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *doc =
            s_llama_doc(cases[i].norm, cases[i].pre, cases[i].ign, cases[i].added, cases[i].post);
        s_refused_json(doc, cases[i].rc, cases[i].must1, cases[i].must2);
        free(doc);
    }
    /* The Split: behavior, invert, regexes that do not compile, may match nothing, or use what
     * PCRE2 would read differently. */
    const struct {
        const char *re, *behavior, *invert, *must1, *must2;
    } splits[] = {
        {"x", "Removed", "false", "pretokenizers[0].behavior \"Removed\" is not supported", NULL},
        {"x", "Isolated", "true", "pretokenizers[0].invert", NULL},
        {"(x", "Isolated", "false", "pretokenizers[0].pattern.Regex", "missing closing"},
        {"x*", "Isolated", "false", "pattern.Regex", "empty string"},
        {"[\\\\S]", "Isolated", "false", "\\S inside a character class", NULL},
        {"[[:alpha:]]", "Isolated", "false", "a character class inside a class", NULL},
        {"", "Isolated", "false", "pattern.Regex: 0 bytes", NULL},
    };
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        snprintf(a, sizeof a, split, splits[i].re, splits[i].behavior, splits[i].invert);
        snprintf(b, sizeof b, bl, "false");
        snprintf(pre, sizeof pre, "{\"type\": \"Sequence\", \"pretokenizers\": [%s, %s]}", a, b);
        char *doc = s_llama_doc(NULL, pre, NULL, NULL, NULL);
        s_refused_json(doc, KVEDGE_ECORRUPT, splits[i].must1, splits[i].must2);
        free(doc);
    }
    /* A ']' first in a class is a literal, and \s inside a class is written out: both load. */
    snprintf(a, sizeof a, split, "[]a]+|[^\\\\s]+|\\\\s+", "Isolated", "false");
    snprintf(b, sizeof b, bl, "false");
    snprintf(pre, sizeof pre, "{\"type\": \"Sequence\", \"pretokenizers\": [%s, %s]}", a, b);
    char *doc = s_llama_doc(NULL, pre, NULL, NULL, NULL);
    kvedge_tokenizer_t *t = s_llama_load(doc);
    free(doc);
    s_want(t, "]a]ab ab", 0, (const int32_t[]){']', 'a', ']', 'a', 'b', ' ', 'a', 'b'}, 8);
    kvedge_tokenizer_destroy(&t);
    /* A model.vocab at the bound with one added token more than it takes. */
    size_t count = KVEDGE_TOKENIZER_VOCAB_MAX;
    char *huge = malloc(count * 20 + 256);
    assert_non_null(huge);
    size_t k = (size_t)sprintf(huge, "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\"}], "
                                     "\"model\": {\"vocab\": {");
    for (size_t i = 0; i < count; i++)
        k += (size_t)sprintf(huge + k, "%s\"t%zu\":%zu", i ? "," : "", i, i);
    strcpy(huge + k, "}, \"merges\": []}}");
    s_refused_json(huge, KVEDGE_ETOOBIG, "model.vocab and added_tokens have more than 1048576",
                   NULL);
    free(huge);
}

/* ---------------------------------------------------------------- the kvedge command */

static char *s_out; /* stdout of the last command */
static char *s_err; /* its stderr */

/* Runs `kvedge ARGS` through the shell; returns its exit code, output in s_out and s_err. */
__attribute__((format(printf, 1, 2))) static int s_run(const char *fmt, ...)
{
    char args[2048], cmd[2600], errp[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    s_path("stderr", errp, sizeof errp);
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", KVEDGE_BIN, args, errp);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t len;
    free(s_out);
    s_out = NULL;
    {
        size_t cap = 4096, n = 0, got;
        char *buf = malloc(cap);
        while (buf && (got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
            n += got;
            if (n + 1 == cap)
                buf = realloc(buf, cap *= 2);
        }
        assert_non_null(buf);
        buf[n] = '\0';
        s_out = buf;
    }
    int st = pclose(p);
    free(s_err);
    s_err = s_read(errp, &len);
    assert_non_null(s_err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle)))                                                              \
            fail_msg("expected \"%s\" in:\n%s", (needle), (hay));                                  \
    } while (0)

/* `kvedge tokenize`: the library's ids, from stdin or --file, with every way to give the
 * tokenizer; --decode back to the bytes; --json; exit codes 2 (usage, a refused file, ids not
 * the tokenizer's) and 1 (a file that cannot be read). */
static void test_cli_tokenize(void **state)
{
    (void)state;
    const char *prose = S_FIX "/texts/prose.txt";
    size_t len, n;
    char *text = s_read(prose, &len);
    kvedge_tokenizer_t *t = s_kjv_fixture();
    int32_t *ids = s_round_trip(t, text, len, &n);
    char *want = malloc(n * 12 + 2);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)sprintf(want + k, "%s%d", i ? " " : "", ids[i]);
    strcpy(want + k, "\n");

    assert_int_equal(s_run("tokenize --tokenizer %s/kjv --file %s", S_FIX, prose), 0);
    assert_string_equal(s_out, want);
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv/tokenizer.json < %s", S_FIX, prose), 0);
    assert_string_equal(s_out, want);
    if (access(KVEDGE_MODELS "/kjv/vocab.json", R_OK) == 0) {
        assert_int_equal(s_run("tokenize --vocab %s/kjv/vocab.json --merges %s/kjv/merges.txt "
                               "--file %s",
                               KVEDGE_MODELS, KVEDGE_MODELS, prose),
                         0);
        assert_string_equal(s_out, want);
    }
    /* Back to the exact bytes, ids from a file or stdin, separated any way. */
    char ip[300];
    s_write(s_path("ids.txt", ip, sizeof ip), want, strlen(want));
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv --decode --file %s", S_FIX, ip), 0);
    assert_string_equal(s_out, text);
    char in[300];
    s_path("in.txt", in, sizeof in);
    s_write(in, "57, 58,\n59", 10);
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv --decode < %s", S_FIX, in), 0);
    char *three;
    size_t tl;
    const int32_t abc[] = {57, 58, 59};
    assert_int_equal(kvedge_tokenizer_decode(t, abc, 3, &three, &tl), KVEDGE_OK);
    assert_string_equal(s_out, three);
    free(three);
    /* --json: valid JSON, bytes that are not UTF-8 as U+FFFD. */
    assert_int_equal(s_run("--json tokenize --tokenizer %s/kjv --file %s", S_FIX, prose), 0);
    cJSON *j = cJSON_Parse(s_out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "ids")), (int)n);
    assert_int_equal(cJSON_GetObjectItem(j, "count")->valueint, (int)n);
    cJSON_Delete(j);
    int32_t ff = kvedge_tokenizer_token_id(t, "\xc3\xbf"); /* byte 0xff */
    char buf[32];
    s_write(in, buf,
            (size_t)snprintf(buf, sizeof buf, "%d %d", ff, kvedge_tokenizer_token_id(t, "a")));
    assert_int_equal(s_run("--json tokenize --tokenizer %s/kjv --decode < %s", S_FIX, in), 0);
    j = cJSON_Parse(s_out);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "text")->valuestring, "\xef\xbf\xbd"
                                                                     "a");
    assert_int_equal(cJSON_GetObjectItem(j, "bytes")->valueint, 2);
    cJSON_Delete(j);
    /* Empty text: an empty line. */
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv < /dev/null", S_FIX), 0);
    assert_string_equal(s_out, "\n");

    /* Usage. */
    assert_int_equal(s_run("tokenize < /dev/null"), 2);
    assert_contains(s_err, "give the tokenizer once");
    assert_int_equal(s_run("tokenize --vocab x.json < /dev/null"), 2);
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv --vocab x --merges y", S_FIX), 2);
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv extra", S_FIX), 2);
    assert_int_equal(s_run("tokenize --bogus"), 2);
    assert_int_equal(s_run("tokenize --help"), 0);
    assert_contains(s_out, "--decode");
    /* A refused file: 2, naming the file and the line. */
    char vp[300], mp[300];
    char *v = s_base_vocab();
    s_write(s_path("vocab.json", vp, sizeof vp), v, strlen(v));
    s_write(s_path("merges.txt", mp, sizeof mp), "#version: 0.2\na b\nb b\n", 20);
    assert_int_equal(s_run("tokenize --vocab %s --merges %s < /dev/null", vp, mp), 2);
    assert_contains(s_err, mp);
    assert_contains(s_err, ":3: ");
    free(v);
    /* Ids that are not the tokenizer's: 2, naming where. */
    s_write(in, "57\n58 4096", 10);
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv --decode < %s", S_FIX, in), 2);
    assert_contains(s_err, "stdin:2: '4096' (id number 3)");
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv --decode --file %s", S_FIX, prose), 2);
    assert_contains(s_err, prose);
    /* A template's BOS: first by default (as prefill and decode add it), not with --add-bos no;
     * --special makes "<s>" written in the text its id. A tokenizer without a template has no
     * BOS to add: --add-bos yes is refused, auto adds nothing. */
    const char *lt = KVEDGE_MODELS "/kjv/llama/tokenizer.json";
    s_write(in, "<s>In", 5);
    assert_int_equal(s_run("tokenize --tokenizer %s < %s", lt, in), 0);
    char *plain = strdup(s_out);
    assert_true(strncmp(plain, "0 ", 2) == 0);
    assert_int_equal(s_run("tokenize --tokenizer %s --add-bos no < %s", lt, in), 0);
    assert_string_equal(s_out, plain + 2);
    assert_int_equal(s_run("tokenize --tokenizer %s --add-bos yes --special < %s", lt, in), 0);
    assert_true(strncmp(s_out, "0 0 ", 4) == 0);
    assert_int_equal(s_run("tokenize --tokenizer %s --add-bos no --special < %s", lt, in), 0);
    assert_true(strncmp(s_out, "0 ", 2) == 0 && strcmp(s_out + 2, plain + 2) != 0);
    free(plain);
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv --add-bos auto --file %s", S_FIX, prose),
                     0);
    assert_string_equal(s_out, want);
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv --add-bos yes --file %s", S_FIX, prose), 2);
    assert_contains(s_err, "adds no BOS");
    assert_int_equal(s_run("tokenize --tokenizer %s --add-bos maybe < %s", lt, in), 2);
    assert_contains(s_err, "auto, yes or no");
    assert_int_equal(s_run("tokenize --tokenizer %s --decode --special < %s", lt, in), 2);
    assert_contains(s_err, "for encoding");

    /* Files that cannot be read: 1. */
    assert_int_equal(s_run("tokenize --tokenizer %s/none.json < /dev/null", S_FIX), 1);
    assert_contains(s_err, "none.json");
    assert_int_equal(s_run("tokenize --tokenizer %s/kjv --file %s/none.txt", S_FIX, S_FIX), 1);

    unlink(vp);
    unlink(mp);
    unlink(ip);
    unlink(in);
    free(want);
    free(ids);
    free(text);
    kvedge_tokenizer_destroy(&t);
}

/* Starts `kvedge store` on an ipc endpoint in the temporary folder; waits until it listens. */
static pid_t s_spawn_node(char ep[300], int *out_fd)
{
    char dir[300];
    s_path("node", dir, sizeof dir);
    snprintf(ep, 300, "ipc://%s/node.sock", s_tmp);
    pid_t pid = kt_spawn_store(KVEDGE_BIN, dir, ep, out_fd);
    assert_true(pid > 0);
    return pid;
}

/* prefill and decode with --tokenizer: a tokenizer whose ids do not fit the model is refused
 * (2) before any request; one that fits (the 256 byte tokens, for the tiny model's 256 rows)
 * turns --context and --prompt into the same ids on both sides, so the edge fetches what the
 * cloud stored, and decode prints the generated text, as valid JSON with --json. */
static void test_cli_e2e(void **state)
{
    (void)state;
    const char *tiny = KVEDGE_FIXTURES "/opt_tiny.safetensors";
    const char *ctx = "In the beginning God created the heaven and the earth. \xc3\x89t\xc3\xa9.";
    assert_int_equal(s_run("-H ipc://%s/nobody.sock prefill --weights %s --tokenizer %s/kjv "
                           "--context 'In the beginning'",
                           s_tmp, tiny, S_FIX),
                     2);
    assert_contains(s_err, "ids up to 4095");
    assert_contains(s_err, "256 embedding rows");
    assert_int_equal(s_run("-H ipc://%s/nobody.sock decode --weights %s --tokenizer %s/kjv "
                           "--context-ids 5 --prompt x",
                           s_tmp, tiny, S_FIX),
                     2);
    assert_int_equal(s_run("-H ipc://%s/nobody.sock decode --weights %s --tokenizer %s/texts "
                           "--context-ids 5 --prompt x",
                           s_tmp, tiny, S_FIX),
                     2);
    assert_contains(s_err, "neither vocab.json");

    char dir[300], vp[300], mp[300];
    mkdir(s_path("bytes", dir, sizeof dir), 0700);
    char *v = s_vocab_json(NULL, 0);
    s_path("bytes/vocab.json", vp, sizeof vp);
    s_path("bytes/merges.txt", mp, sizeof mp);
    s_write(vp, v, strlen(v));
    s_write(mp, "#version: 0.2\n", 14);
    free(v);
    kvedge_tokenizer_t *t = NULL;
    char why[KVEDGE_TOKENIZER_WHY_BYTES];
    assert_int_equal(kvedge_tokenizer_load_dir(dir, &t, why, sizeof why), KVEDGE_OK);

    char ep[300];
    int out_fd;
    pid_t node = s_spawn_node(ep, &out_fd);
    assert_int_equal(s_run("-H %s --json prefill --weights %s --tokenizer %s --context '%s' "
                           "--chunk-tokens 16 --scheme lossless --dtype fp32",
                           ep, tiny, dir, ctx),
                     0);
    assert_contains(s_out, "\"tokens\":61"); /* 61 bytes, one token each */
    assert_int_equal(s_run("-H %s --json decode --weights %s --tokenizer %s --context '%s' "
                           "--chunk-tokens 16 --prompt 'And the earth' --max-new 12",
                           ep, tiny, dir, ctx),
                     0);
    cJSON *j = cJSON_Parse(s_out);
    if (!j)
        fail_msg("not JSON:\n%s", s_out);
    assert_int_equal(cJSON_GetObjectItem(j, "prompt_tokens")->valueint, 13);
    assert_int_equal(cJSON_GetObjectItem(j, "context_tokens")->valueint, 61);
    const cJSON *kv = cJSON_GetObjectItem(j, "kvedge");
    assert_int_equal(cJSON_GetObjectItem(kv, "fetched")->valueint, 3);
    const cJSON *gen = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "tokens"), "kvedge");
    assert_int_equal(cJSON_GetArraySize(gen), 12);
    int32_t g[12];
    for (int i = 0; i < 12; i++)
        g[i] = cJSON_GetArrayItem(gen, i)->valueint;
    char *dec;
    size_t dl;
    assert_int_equal(kvedge_tokenizer_decode(t, g, 12, &dec, &dl), KVEDGE_OK);
    const char *jt = cJSON_GetObjectItem(j, "text")->valuestring;
    assert_true(strlen(jt) >= dl); /* each byte that is not UTF-8 became 3 bytes of U+FFFD */
    /* People's output: the text's exact bytes between the quotes. */
    assert_int_equal(s_run("-H %s decode --weights %s --tokenizer %s --context '%s' "
                           "--chunk-tokens 16 --prompt 'And the earth' --max-new 12",
                           ep, tiny, dir, ctx),
                     0);
    char *line = malloc(dl + 16);
    snprintf(line, dl + 16, "text: \"%s\"\n", dec);
    assert_contains(s_out, line);
    free(line);
    free(dec);
    cJSON_Delete(j);
    kill(node, SIGTERM);
    waitpid(node, NULL, 0);
    close(out_fd);
    kvedge_tokenizer_destroy(&t);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/node' '%s'", s_tmp, dir);
    assert_int_equal(system(cmd), 0);
}

int main(int argc, char **argv)
{
    s_gpt2_dir = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_fixtures),
        cmocka_unit_test(test_pieces),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_invalid_utf8_gpt2),
        cmocka_unit_test_setup_teardown(test_kjv, s_setup_tmp, s_teardown_tmp),
        cmocka_unit_test(test_kjv_llama),
        cmocka_unit_test(test_merge_passes),
        cmocka_unit_test(test_degenerate),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_megabyte),
        cmocka_unit_test_setup_teardown(test_refuse_vocab, s_setup_tmp, s_teardown_tmp),
        cmocka_unit_test_setup_teardown(test_refuse_merges, s_setup_tmp, s_teardown_tmp),
        cmocka_unit_test_setup_teardown(test_refuse_json, s_setup_tmp, s_teardown_tmp),
        cmocka_unit_test(test_llama_form),
        cmocka_unit_test_setup_teardown(test_refuse_llama_json, s_setup_tmp, s_teardown_tmp),
        cmocka_unit_test_setup_teardown(test_cli_tokenize, s_setup_tmp, s_teardown_tmp),
        cmocka_unit_test_setup_teardown(test_cli_e2e, s_setup_tmp, s_teardown_tmp),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    free(s_out);
    free(s_err);
    return failed;
}
