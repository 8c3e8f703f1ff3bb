/* The tokenizer against llama.cpp's own tokenizer test cases: for Llama 3 (llama-bpe) and Qwen2
 * (and GPT-2's form, gpt-2), every text of llama.cpp's models/ggml-vocab-VOCAB.gguf.inp gives
 * exactly the ids of its .out (which Hugging Face's tokenizers wrote), from the tokenizer.json that
 * tests/tokenizer/ gguf_vocab.py makes of the .gguf vocabulary. llama.cpp's
 * tests/test-tokenizer-0.cpp reads the cases the same way: texts separated by
 * "\n__ggml_vocab_test__\n", one line of ids each, with neither BOS nor special tokens parsed. Then
 * what the cases leave out: the template's BOS, special and plain added tokens in the text, and
 * decoding.
 *
 * argv[1]: the folder tests/tokenizer/fetch_llama.sh fills (ctest passes it); skips (77) when it
 * lacks the cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <time.h>
#include <unistd.h>

#include "clients/decoder/tokenizer.h"
#include "access/codec/error.h"

static const char *s_dir; /* argv[1] */

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

static kvedge_tokenizer_t *s_load(const char *vocab)
{
    char p[1024], why[KVEDGE_TOKENIZER_WHY_BYTES] = "";
    snprintf(p, sizeof p, "%s/%s/tokenizer.json", s_dir, vocab);
    kvedge_tokenizer_t *t = NULL;
    int rc = kvedge_tokenizer_load_json(p, &t, why, sizeof why);
    if (rc != KVEDGE_OK)
        print_message("%s\n", why);
    assert_int_equal(rc, KVEDGE_OK);
    return t;
}

/* Runs every case of VOCAB.inp / VOCAB.out; returns the cases, *same those that match. */
static size_t s_cases(kvedge_tokenizer_t *t, const char *vocab, size_t *same)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char p[1024];
    size_t il, ol;
    snprintf(p, sizeof p, "%s/%s/%s.inp", s_dir, vocab, vocab);
    char *inp = s_read(p, &il);
    snprintf(p, sizeof p, "%s/%s/%s.out", s_dir, vocab, vocab);
    char *out = s_read(p, &ol);
    assert_non_null(inp);
    assert_non_null(out);
    size_t cases = 0;
    *same = 0;
    const char *ip = inp, *iend = inp + il, *op = out, *oend = out + ol;
    while (ip < iend) {
        const char *next = strstr(ip, sep);
        size_t tl = next ? (size_t)(next - ip) : (size_t)(iend - ip);
        /* One line of the .out: ids separated by spaces (leading and trailing ones stripped). */
        assert_true(op < oend);
        const char *nl = memchr(op, '\n', (size_t)(oend - op));
        const char *le = nl ? nl : oend;
        int32_t want[4096];
        size_t wn = 0;
        for (const char *c = op; c < le;) {
            while (c < le && (*c == ' ' || *c == '\r' || *c == '\t'))
                c++;
            if (c == le)
                break;
            char *e;
            long v = strtol(c, &e, 10);
            assert_true(e > c && wn < sizeof want / sizeof want[0]);
            want[wn++] = (int32_t)v;
            c = e;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(kvedge_tokenizer_encode(t, ip, tl, &ids, &n), KVEDGE_OK);
        bool ok = n == wn && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
        if (ok) {
            (*same)++;
        } else {
            size_t i = 0;
            while (i < n && i < wn && ids[i] == want[i])
                i++;
            print_message("%s case %zu (\"%.*s\"): %zu ids, llama.cpp's %zu; first difference at "
                          "%zu: %d, want %d\n",
                          vocab, cases, (int)(tl > 60 ? 60 : tl), ip, n, wn, i, i < n ? ids[i] : -1,
                          i < wn ? want[i] : -1);
        }
        free(ids);
        cases++;
        op = nl ? nl + 1 : oend;
        ip = next ? next + sizeof sep - 1 : iend;
    }
    free(out);
    free(inp);
    return cases;
}

/* Prints the time to encode 1 MiB of the cases' texts, repeated (not asserted: the machine is
 * shared). */
static void s_time(kvedge_tokenizer_t *t, const char *vocab)
{
    char p[1024];
    size_t il;
    snprintf(p, sizeof p, "%s/%s/%s.inp", s_dir, vocab, vocab);
    char *inp = s_read(p, &il);
    assert_non_null(inp);
    assert_true(il > 0);
    size_t len = 1u << 20;
    char *buf = malloc(len);
    assert_non_null(buf);
    for (size_t k = 0; k < len; k += il)
        memcpy(buf + k, inp, len - k < il ? len - k : il);
    struct timespec a, b;
    int32_t *ids = NULL;
    size_t n = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(kvedge_tokenizer_encode(t, buf, len, &ids, &n), KVEDGE_OK);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
    print_message("%s: 1 MiB of the cases' texts -> %zu ids in %.1f ms (%.1f MB/s)\n", vocab, n, ms,
                  (double)len / 1e3 / ms);
    free(ids);
    free(buf);
    free(inp);
}

/* Every llama-bpe (Llama 3) case gives llama.cpp's ids. */
static void test_llama_bpe(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_load("llama-bpe");
    size_t same, cases = s_cases(t, "llama-bpe", &same);
    print_message("llama-bpe: %zu of %zu cases give llama.cpp's ids\n", same, cases);
    assert_true(cases >= 40);
    assert_int_equal(same, cases);
    s_time(t, "llama-bpe");
    kvedge_tokenizer_destroy(&t);
}

/* Every qwen2 case gives llama.cpp's ids. */
static void test_qwen2(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_load("qwen2");
    size_t same, cases = s_cases(t, "qwen2", &same);
    print_message("qwen2: %zu of %zu cases give llama.cpp's ids\n", same, cases);
    assert_true(cases >= 40);
    assert_int_equal(same, cases);
    s_time(t, "qwen2");
    kvedge_tokenizer_destroy(&t);
}

/* Every gpt-2 case gives llama.cpp's ids: GPT-2's form of tokenizer.json (ByteLevel with GPT-2's
 * pattern) checked by the same reference. */
static void test_gpt2(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_load("gpt-2");
    size_t same, cases = s_cases(t, "gpt-2", &same);
    print_message("gpt-2: %zu of %zu cases give llama.cpp's ids\n", same, cases);
    assert_true(cases >= 40);
    assert_int_equal(same, cases);
    kvedge_tokenizer_destroy(&t);
}

static void s_encode(kvedge_tokenizer_t *t, const char *text, unsigned flags, int32_t **ids,
                     size_t *n)
{
    assert_int_equal(kvedge_tokenizer_encode_ex(t, text, strlen(text), flags, ids, n), KVEDGE_OK);
}

/* Llama 3: the template's BOS (128000) only when asked; special tokens in the text are their
 * ids only when asked, text otherwise; decoding gives the text back, special tokens included. */
static void test_llama_specials(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_load("llama-bpe");
    assert_int_equal(kvedge_tokenizer_bos_id(t), 128000);
    assert_int_equal(kvedge_tokenizer_eos_id(t), -1);
    assert_int_equal(kvedge_tokenizer_token_id(t, "<|begin_of_text|>"), 128000);
    assert_int_equal(kvedge_tokenizer_token_id(t, "<|eot_id|>"), 128009);
    assert_int_equal(kvedge_tokenizer_vocab_size(t), 128256);
    int32_t *plain = NULL, *bos = NULL, *sp = NULL, *txt = NULL;
    size_t pn, bn, sn, tn;
    s_encode(t, "Hello world", 0, &plain, &pn);
    s_encode(t, "Hello world", KVEDGE_TOKENIZER_TEMPLATE, &bos, &bn);
    assert_int_equal(bn, pn + 1);
    assert_int_equal(bos[0], 128000);
    assert_memory_equal(bos + 1, plain, pn * sizeof *plain);
    /* "Hello world" is 9906 1917 in llama-bpe.out. */
    assert_int_equal(pn, 2);
    assert_int_equal(plain[0], 9906);
    assert_int_equal(plain[1], 1917);
    const char *chat = "<|start_header_id|>user<|end_header_id|>\n\nHello world<|eot_id|>";
    s_encode(t, chat, KVEDGE_TOKENIZER_SPECIAL, &sp, &sn);
    static const int32_t want[] = {128006, 882, 128007, 271, 9906, 1917, 128009};
    assert_int_equal(sn, sizeof want / sizeof want[0]);
    assert_memory_equal(sp, want, sizeof want);
    s_encode(t, chat, 0, &txt, &tn);
    assert_true(tn > sn);
    for (size_t i = 0; i < tn; i++)
        assert_true(txt[i] < 128000);
    char *back = NULL;
    size_t blen = 0;
    assert_int_equal(kvedge_tokenizer_decode(t, sp, sn, &back, &blen), KVEDGE_OK);
    assert_int_equal(blen, strlen(chat));
    assert_memory_equal(back, chat, blen);
    free(back);
    assert_int_equal(kvedge_tokenizer_decode(t, txt, tn, &back, &blen), KVEDGE_OK);
    assert_memory_equal(back, chat, blen);
    free(back);
    free(txt);
    /* An unknown flag is refused. */
    assert_int_equal(kvedge_tokenizer_encode_ex(t, "x", 1, 4u, &txt, &tn), KVEDGE_EINVAL);
    assert_null(txt);
    free(plain);
    free(bos);
    free(sp);
    kvedge_tokenizer_destroy(&t);
}

/* Qwen2: no BOS; <|im_start|> is special; its [PAD...] tokens are added but not special, so
 * they are matched in any text (as llama.cpp does with user-defined tokens); NFC: a decomposed
 * "é" gives the ids of the composed one. */
static void test_qwen2_specials(void **state)
{
    (void)state;
    kvedge_tokenizer_t *t = s_load("qwen2");
    assert_int_equal(kvedge_tokenizer_bos_id(t), -1);
    assert_int_equal(kvedge_tokenizer_eos_id(t), -1);
    int32_t *a = NULL, *b = NULL;
    size_t an, bn;
    s_encode(t, "<|im_start|>user", KVEDGE_TOKENIZER_SPECIAL | KVEDGE_TOKENIZER_TEMPLATE, &a, &an);
    assert_int_equal(a[0], 151644);
    assert_int_equal(an, 2);
    free(a);
    s_encode(t, "<|im_start|>user", 0, &a, &an);
    assert_true(an > 2);
    assert_int_not_equal(a[0], 151644);
    free(a);
    s_encode(t, "x[PAD151646]y", 0, &a, &an);
    assert_int_equal(an, 3);
    assert_int_equal(a[1], 151646);
    free(a);
    s_encode(t, "caf\xc3\xa9 au lait", 0, &a, &an);
    s_encode(t, "cafe\xcc\x81 au lait", 0, &b, &bn);
    assert_int_equal(an, bn);
    assert_memory_equal(a, b, an * sizeof *a);
    free(a);
    free(b);
    kvedge_tokenizer_destroy(&t);
}

int main(int argc, char **argv)
{
    s_dir = argc > 1 ? argv[1] : NULL;
    char p[1024];
    snprintf(p, sizeof p, "%s/installed", s_dir ? s_dir : ".");
    if (!s_dir || access(p, R_OK) != 0) {
        printf("test_tokenizer_llama: llama.cpp's cases are not in %s (tests/tokenizer/"
               "fetch_llama.sh installs them; the registry was unreachable?): skipped\n",
               s_dir ? s_dir : "(no folder given)");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_bpe),      cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_gpt2),           cmocka_unit_test(test_llama_specials),
        cmocka_unit_test(test_qwen2_specials),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
