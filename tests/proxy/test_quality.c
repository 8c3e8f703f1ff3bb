/* The quality profile (proxy/quality.h): a good profile parses and prices each layer and rung
 * (lossless free, negative perplexity changes clamped, unmeasured rungs not found), the file
 * loads from disk, every malformed or out-of-bounds input is refused with a reason, and the
 * budget syntax the planner's budgets are given in (access/proto.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proxy/quality.h"
#include "access/codec/error.h"

/* Two layers, three rungs; layer 1's think-50 perplexity change is negative. */
static const char s_good[] =
    "{\"kvedge_quality_profile\": 1, \"model\": \"kjv-cloud\", \"layers\": 2,\n"
    " \"context_tokens\": 256, \"continuation_tokens\": 128, \"documents\": 54,\n"
    " \"positions\": 6912, \"lossless_ppl\": 55.76, \"writer\": \"test\",\n"
    " \"rungs\": [\"int8\", \"int4-g32\", \"lossless+think-50\"],\n"
    " \"per_layer\": [\n"
    "  {\"layer\": 0, \"ppl_pct\": [0.0004, 0.001, 0.032], \"kl\": [8e-8, 8.4e-6, 2e-3],\n"
    "   \"agreement\": [0.9999, 0.9975, 0.9702], \"extra\": [1, 2]},\n"
    "  {\"layer\": 1, \"ppl_pct\": [0.0002, 0.0033, -0.068], \"kl\": [1e-8, 1.6e-6, 7.6e-4],\n"
    "   \"agreement\": [1, 0.9993, 0.99]}],\n"
    " \"whole_model\": [{\"rung\": \"int8\", \"ppl_pct\": 0.00016, \"kl\": 8.3e-8,\n"
    "   \"agreement\": 0.9997, \"bytes_over_fp16\": 0.536},\n"
    "  {\"rung\": \"int4-g128\", \"ppl_pct\": 0.015, \"kl\": 2.5e-5, \"agreement\": 0.997}]}\n";

static kvedge_quality_profile_t *s_load_good(void)
{
    kvedge_quality_profile_t *p = NULL;
    char why[256] = "";
    int rc = kvedge_quality_parse(s_good, strlen(s_good), &p, why, sizeof why);
    if (rc != KVEDGE_OK)
        fail_msg("good profile refused: %s", why);
    assert_non_null(p);
    return p;
}

static kvedge_prec_t s_prec(const char *name)
{
    kvedge_prec_t x = 0;
    assert_int_equal(kvedge_prec_parse(name, &x), KVEDGE_OK);
    return x;
}

static double s_cost(const kvedge_quality_profile_t *p, uint32_t l, const char *rung,
                     kvedge_quality_metric_t m)
{
    double c = -1;
    assert_int_equal(kvedge_quality_cost(p, l, s_prec(rung), m, &c), KVEDGE_OK);
    return c;
}

/* ---------------------------------------------------------------- a good profile */

static void test_good(void **state)
{
    (void)state;
    kvedge_quality_profile_t *p = s_load_good();
    assert_string_equal(kvedge_quality_model(p), "kjv-cloud");
    assert_int_equal(kvedge_quality_layers(p), 2);
    assert_int_equal(kvedge_quality_context_tokens(p), 256);
    assert_int_equal(kvedge_quality_continuation_tokens(p), 128);
    assert_int_equal(kvedge_quality_documents(p), 54);
    assert_int_equal(kvedge_quality_n_rungs(p), 3);
    assert_int_equal(kvedge_quality_rung(p, 0), KVEDGE_PREC_INT8);
    assert_int_equal(kvedge_quality_rung(p, 1), KVEDGE_PREC_INT4_G32);
    assert_int_equal(kvedge_quality_rung(p, 2),
                     KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, KVEDGE_PREC_THINK_50));
    assert_int_equal(kvedge_quality_rung(p, 3), KVEDGE_PREC_STORED);

    /* Costs, per layer and rung, as the file says. */
    assert_true(s_cost(p, 0, "int8", KVEDGE_QUALITY_PPL_PCT) == 0.0004);
    assert_true(s_cost(p, 0, "int4-g32", KVEDGE_QUALITY_KL) == 8.4e-6);
    assert_true(s_cost(p, 1, "int4-g32", KVEDGE_QUALITY_PPL_PCT) == 0.0033);
    assert_true(s_cost(p, 1, "lossless+think-50", KVEDGE_QUALITY_KL) == 7.6e-4);
    assert_true(s_cost(p, 0, "lossless+think-50", KVEDGE_QUALITY_PPL_PCT) == 0.032);
    /* A negative perplexity change costs 0; the raw figure keeps it. */
    assert_true(s_cost(p, 1, "lossless+think-50", KVEDGE_QUALITY_PPL_PCT) == 0);
    kvedge_quality_figures_t f;
    assert_int_equal(kvedge_quality_figures(p, 1, s_prec("lossless+think-50"), &f), KVEDGE_OK);
    assert_true(f.ppl_pct == -0.068 && f.kl == 7.6e-4 && f.agreement == 0.99);
    /* Lossless is free at every layer, whether or not the file lists it. */
    for (uint32_t l = 0; l < 2; l++) {
        assert_true(s_cost(p, l, "lossless", KVEDGE_QUALITY_PPL_PCT) == 0);
        assert_true(s_cost(p, l, "lossless", KVEDGE_QUALITY_KL) == 0);
    }
    assert_true(kvedge_quality_has(p, KVEDGE_PREC_LOSSLESS));
    assert_true(kvedge_quality_has(p, KVEDGE_PREC_INT8));
    assert_false(kvedge_quality_has(p, KVEDGE_PREC_INT4_G64));
    assert_false(kvedge_quality_has(p, KVEDGE_PREC_STORED));

    /* A rung not measured: not found, the output untouched. */
    double c = 42;
    assert_int_equal(kvedge_quality_cost(p, 0, KVEDGE_PREC_INT4_G64, KVEDGE_QUALITY_KL, &c),
                     KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_quality_cost(p, 0, s_prec("int8+think-75"), KVEDGE_QUALITY_KL, &c),
                     KVEDGE_ENOTFOUND);
    assert_true(c == 42);
    /* Argument errors. */
    assert_int_equal(kvedge_quality_cost(p, 2, KVEDGE_PREC_INT8, KVEDGE_QUALITY_KL, &c),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_cost(p, 2, KVEDGE_PREC_LOSSLESS, KVEDGE_QUALITY_KL, &c),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_cost(p, 0, KVEDGE_PREC_STORED, KVEDGE_QUALITY_KL, &c),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_cost(p, 0, 0x80 | KVEDGE_PREC_LOSSLESS, KVEDGE_QUALITY_KL, &c),
                     KVEDGE_EINVAL);
    /* An entropy-coded rung has its plain rung's figures: the coding is lossless. */
    double plain = -1, coded = -2;
    assert_int_equal(kvedge_quality_cost(p, 0, KVEDGE_PREC_INT8, KVEDGE_QUALITY_KL, &plain), 0);
    assert_int_equal(
        kvedge_quality_cost(p, 0, KVEDGE_PREC_INT8 | KVEDGE_PREC_EC, KVEDGE_QUALITY_KL, &coded), 0);
    assert_true(plain == coded);
    assert_true(kvedge_quality_has(p, KVEDGE_PREC_INT8 | KVEDGE_PREC_EC));
    assert_int_equal(kvedge_quality_cost(p, 0, KVEDGE_PREC_INT8, (kvedge_quality_metric_t)7, &c),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_cost(p, 0, KVEDGE_PREC_INT8, KVEDGE_QUALITY_NONE, &c),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_cost(p, 0, KVEDGE_PREC_INT8, KVEDGE_QUALITY_KL, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_cost(NULL, 0, KVEDGE_PREC_INT8, KVEDGE_QUALITY_KL, &c),
                     KVEDGE_EINVAL);
    assert_true(c == 42);

    /* Whole-model rows: for any rung the file has, listed or not among the per-layer rungs. */
    assert_int_equal(kvedge_quality_whole(p, KVEDGE_PREC_INT8, &f), KVEDGE_OK);
    assert_true(f.ppl_pct == 0.00016 && f.kl == 8.3e-8 && f.agreement == 0.9997);
    assert_int_equal(kvedge_quality_whole(p, KVEDGE_PREC_INT4_G128, &f), KVEDGE_OK);
    assert_true(f.kl == 2.5e-5);
    assert_int_equal(kvedge_quality_whole(p, KVEDGE_PREC_INT4_G32, &f), KVEDGE_ENOTFOUND);
    assert_int_equal(kvedge_quality_whole(p, KVEDGE_PREC_LOSSLESS, &f), KVEDGE_OK);
    assert_true(f.ppl_pct == 0 && f.kl == 0 && f.agreement == 1);
    assert_int_equal(kvedge_quality_whole(p, KVEDGE_PREC_STORED, &f), KVEDGE_EINVAL);

    kvedge_quality_destroy(&p);
    assert_null(p);
    kvedge_quality_destroy(&p);
    kvedge_quality_destroy(NULL);
    /* Accessors of NULL. */
    assert_null(kvedge_quality_model(NULL));
    assert_int_equal(kvedge_quality_layers(NULL), 0);
    assert_int_equal(kvedge_quality_n_rungs(NULL), 0);
    assert_false(kvedge_quality_has(NULL, KVEDGE_PREC_LOSSLESS));
}

/* The minimum: version, model, layers, rungs, per_layer; no whole-model rows; not
 * NUL-terminated, with trailing whitespace and a NUL. */
static void test_minimal(void **state)
{
    (void)state;
    const char js[] = "{\"kvedge_quality_profile\":1,\"model\":\"m\",\"layers\":1,"
                      "\"rungs\":[\"int4\"],\"per_layer\":[{\"layer\":0,\"ppl_pct\":[-0.5],"
                      "\"kl\":[0],\"agreement\":[0]}]} \n\t";
    kvedge_quality_profile_t *p = NULL;
    char why[256] = "";
    char *copy = malloc(sizeof js - 1); /* exactly the bytes, no NUL after them */
    assert_non_null(copy);
    memcpy(copy, js, sizeof js - 1);
    int rc = kvedge_quality_parse(copy, sizeof js - 1, &p, why, sizeof why);
    if (rc != KVEDGE_OK)
        fail_msg("%s", why);
    free(copy);
    assert_int_equal(kvedge_quality_rung(p, 0), KVEDGE_PREC_INT4_G32);
    assert_int_equal(kvedge_quality_documents(p), 0);
    assert_int_equal(kvedge_quality_context_tokens(p), 0);
    assert_true(s_cost(p, 0, "int4-g32", KVEDGE_QUALITY_PPL_PCT) == 0);
    kvedge_quality_figures_t f;
    assert_int_equal(kvedge_quality_whole(p, KVEDGE_PREC_INT4_G32, &f), KVEDGE_ENOTFOUND);
    kvedge_quality_destroy(&p);
    assert_int_equal(kvedge_quality_parse(js, sizeof js, &p, NULL, 0), KVEDGE_OK); /* with NUL */
    kvedge_quality_destroy(&p);
}

/* ---------------------------------------------------------------- files */

static char s_dir[64];

static void s_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", s_dir, name);
}

static void s_write(const char *path, const char *body, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(body, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void test_files(void **state)
{
    (void)state;
    char path[256], why[512] = "";
    kvedge_quality_profile_t *p = NULL;
    s_path(path, sizeof path, "good.json");
    s_write(path, s_good, strlen(s_good));
    int rc = kvedge_quality_load(path, &p, why, sizeof why);
    if (rc != KVEDGE_OK)
        fail_msg("%s", why);
    assert_int_equal(kvedge_quality_layers(p), 2);
    assert_true(s_cost(p, 1, "int4-g32", KVEDGE_QUALITY_PPL_PCT) == 0.0033);
    kvedge_quality_destroy(&p);

    /* Missing file: EIO naming the path. */
    s_path(path, sizeof path, "missing.json");
    p = (kvedge_quality_profile_t *)1;
    assert_int_equal(kvedge_quality_load(path, &p, why, sizeof why), KVEDGE_EIO);
    assert_null(p);
    assert_non_null(strstr(why, path));
    printf("  missing: %s\n", why);
    /* A directory. */
    assert_int_equal(kvedge_quality_load(s_dir, &p, why, sizeof why), KVEDGE_EIO);
    /* Too big: the limit plus one byte of spaces after a good profile. */
    size_t big = KVEDGE_QUALITY_MAX_FILE_BYTES + 1;
    char *body = malloc(big);
    assert_non_null(body);
    memset(body, ' ', big);
    memcpy(body, s_good, strlen(s_good));
    s_path(path, sizeof path, "big.json");
    s_write(path, body, big);
    assert_int_equal(kvedge_quality_load(path, &p, why, sizeof why), KVEDGE_ETOOBIG);
    assert_non_null(strstr(why, path));
    printf("  too big: %s\n", why);
    assert_int_equal(kvedge_quality_parse(body, big, &p, why, sizeof why), KVEDGE_ETOOBIG);
    /* Exactly the limit is fine. */
    s_write(path, body, big - 1);
    assert_int_equal(kvedge_quality_load(path, &p, why, sizeof why), KVEDGE_OK);
    kvedge_quality_destroy(&p);
    free(body);
    /* Empty file. */
    s_path(path, sizeof path, "empty.json");
    s_write(path, "", 0);
    assert_int_equal(kvedge_quality_load(path, &p, why, sizeof why), KVEDGE_EINVAL);
    assert_null(p);
    /* Argument errors. */
    assert_int_equal(kvedge_quality_load(NULL, &p, why, sizeof why), KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_load(path, NULL, why, sizeof why), KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_parse(NULL, 1, &p, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_parse("{}", 2, NULL, NULL, 0), KVEDGE_EINVAL);
}

/* ---------------------------------------------------------------- bad profiles */

/* s_good with the first occurrence of `from` replaced by `to`. */
static char *s_edit(const char *from, const char *to)
{
    const char *at = strstr(s_good, from);
    if (!at)
        fail_msg("'%s' is not in the good profile", from);
    size_t a = (size_t)(at - s_good), n = strlen(s_good) - strlen(from) + strlen(to);
    char *s = malloc(n + 2); /* room for one more character */
    assert_non_null(s);
    memcpy(s, s_good, a);
    strcpy(s + a, to);
    strcat(s, at + strlen(from));
    return s;
}

static void test_bad(void **state)
{
    (void)state;
    static const struct {
        const char *what, *from, *to;
        int rc;
    } cases[] = {
        {"wrong version", "\"kvedge_quality_profile\": 1", "\"kvedge_quality_profile\": 2",
         KVEDGE_EVERSION},
        {"version as a string", "\"kvedge_quality_profile\": 1",
         "\"kvedge_quality_profile\": \"1\"", KVEDGE_EVERSION},
        {"no version", "\"kvedge_quality_profile\": 1", "\"version\": 1", KVEDGE_EINVAL},
        {"empty model", "\"model\": \"kjv-cloud\"", "\"model\": \"\"", KVEDGE_EINVAL},
        {"model not a string", "\"model\": \"kjv-cloud\"", "\"model\": 5", KVEDGE_EINVAL},
        {"model too long", "\"model\": \"kjv-cloud\"",
         "\"model\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
         "\"",
         KVEDGE_EINVAL},
        {"layers mismatch (3 vs 2 rows)", "\"layers\": 2", "\"layers\": 3", KVEDGE_EINVAL},
        {"layers mismatch (1 vs 2 rows)", "\"layers\": 2", "\"layers\": 1", KVEDGE_EINVAL},
        {"layers 0", "\"layers\": 2", "\"layers\": 0", KVEDGE_EINVAL},
        {"layers fractional", "\"layers\": 2", "\"layers\": 2.5", KVEDGE_EINVAL},
        {"layers negative", "\"layers\": 2", "\"layers\": -2", KVEDGE_EINVAL},
        {"layers over the limit", "\"layers\": 2", "\"layers\": 1025", KVEDGE_ETOOBIG},
        {"layers missing", "\"layers\": 2,", "", KVEDGE_EINVAL},
        {"context negative", "\"context_tokens\": 256", "\"context_tokens\": -1", KVEDGE_EINVAL},
        {"documents a string", "\"documents\": 54", "\"documents\": \"54\"", KVEDGE_EINVAL},
        {"duplicate rung", "\"int4-g32\", \"lossless+think-50\"", "\"int8\", \"lossless+think-50\"",
         KVEDGE_EINVAL},
        {"duplicate rung (alias)", "\"int4-g32\", \"lossless+think-50\"", "\"int4\", \"int4-g32\"",
         KVEDGE_EINVAL},
        {"unknown rung", "\"int4-g32\", \"lossless", "\"int4-g16\", \"lossless", KVEDGE_EINVAL},
        {"rung fp16", "\"int4-g32\", \"lossless", "\"fp16\", \"lossless", KVEDGE_EINVAL},
        {"rung stored", "\"int4-g32\", \"lossless", "\"stored\", \"lossless", KVEDGE_EINVAL},
        {"rung not a string", "\"int4-g32\", \"lossless", "3, \"lossless", KVEDGE_EINVAL},
        {"no rungs", "[\"int8\", \"int4-g32\", \"lossless+think-50\"]", "[]", KVEDGE_EINVAL},
        {"too many rungs", "[\"int8\", \"int4-g32\", \"lossless+think-50\"]",
         "[\"lossless\",\"int8\",\"int4-g32\",\"int4-g64\",\"int4-g128\",\"lossless+think-75\","
         "\"int8+think-75\",\"int4-g32+think-75\",\"int4-g64+think-75\",\"int4-g128+think-75\","
         "\"lossless+think-50\",\"int8+think-50\",\"int4-g32+think-50\",\"int4-g64+think-50\","
         "\"int4-g128+think-50\",\"tc\",\"int8\"]",
         KVEDGE_ETOOBIG},
        {"NaN KL (null)", "[8e-8, 8.4e-6, 2e-3]", "[8e-8, null, 2e-3]", KVEDGE_EINVAL},
        {"NaN KL (literal)", "[8e-8, 8.4e-6, 2e-3]", "[8e-8, NaN, 2e-3]", KVEDGE_EINVAL},
        {"infinite ppl", "[0.0004, 0.001, 0.032]", "[0.0004, 1e999, 0.032]", KVEDGE_EINVAL},
        {"negative KL", "[8e-8, 8.4e-6, 2e-3]", "[8e-8, -8.4e-6, 2e-3]", KVEDGE_EINVAL},
        {"ppl change of -100 %", "[0.0004, 0.001, 0.032]", "[-100, 0.001, 0.032]", KVEDGE_EINVAL},
        {"agreement above 1", "[0.9999, 0.9975, 0.9702]", "[0.9999, 1.5, 0.9702]", KVEDGE_EINVAL},
        {"agreement a string", "[0.9999, 0.9975, 0.9702]", "[0.9999, \"x\", 0.9702]",
         KVEDGE_EINVAL},
        {"short ppl array", "[0.0004, 0.001, 0.032]", "[0.0004, 0.001]", KVEDGE_EINVAL},
        {"long kl array", "[8e-8, 8.4e-6, 2e-3]", "[8e-8, 8.4e-6, 2e-3, 1]", KVEDGE_EINVAL},
        {"kl missing", "\"kl\": [8e-8, 8.4e-6, 2e-3],", "", KVEDGE_EINVAL},
        {"layer index wrong", "{\"layer\": 1,", "{\"layer\": 0,", KVEDGE_EINVAL},
        {"layer index missing", "{\"layer\": 0,", "{", KVEDGE_EINVAL},
        {"per_layer not an array", "\"per_layer\": [", "\"per_layer\": 5, \"x\": [", KVEDGE_EINVAL},
        {"whole_model unknown rung", "{\"rung\": \"int8\"", "{\"rung\": \"int2\"", KVEDGE_EINVAL},
        {"whole_model duplicate rung", "{\"rung\": \"int4-g128\"", "{\"rung\": \"int8\"",
         KVEDGE_EINVAL},
        {"whole_model NaN", "\"kl\": 8.3e-8", "\"kl\": null", KVEDGE_EINVAL},
        {"whole_model negative bytes", "\"bytes_over_fp16\": 0.536", "\"bytes_over_fp16\": -1",
         KVEDGE_EINVAL},
        {"whole_model not an array", "\"whole_model\": [", "\"whole_model\": 3, \"x\": [",
         KVEDGE_EINVAL},
        {"truncated", "\"documents\": 54", "\"documents\": 54", KVEDGE_EINVAL}, /* cut below */
        {"trailing garbage", "}]}\n", "}]} x", KVEDGE_EINVAL},
        {"not an object", "{\"kvedge_quality_profile\"", "[{\"kvedge_quality_profile\"",
         KVEDGE_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *js = s_edit(cases[i].from, cases[i].to);
        if (strcmp(cases[i].what, "not an object") == 0)
            strcat(js, "]");
        size_t len = strlen(js);
        if (strcmp(cases[i].what, "truncated") == 0)
            len /= 2;
        kvedge_quality_profile_t *p = (kvedge_quality_profile_t *)1;
        char why[512] = "";
        int rc = kvedge_quality_parse(js, len, &p, why, sizeof why);
        if (rc != cases[i].rc)
            fail_msg("%s: %s (%s), expected %s", cases[i].what, kvedge_errname(rc), why,
                     kvedge_errname(cases[i].rc));
        assert_null(p);
        assert_true(strncmp(why, "profile: ", 9) == 0);
        printf("  %-30s %s\n", cases[i].what, why);
        free(js);
    }
    /* A truncated file names its path. */
    char path[256], why[512] = "";
    s_path(path, sizeof path, "cut.json");
    s_write(path, s_good, 100);
    kvedge_quality_profile_t *p = NULL;
    assert_int_equal(kvedge_quality_load(path, &p, why, sizeof why), KVEDGE_EINVAL);
    assert_non_null(strstr(why, path));
    assert_non_null(strstr(why, "truncated"));
    /* The why buffer may be absent or tiny. */
    assert_int_equal(kvedge_quality_load(path, &p, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_load(path, &p, why, 4), KVEDGE_EINVAL);
    assert_true(strlen(why) < 4);
}

/* The limits exactly: 1024 layers and 16 rungs (the whole ladder, tc included) are fine. */
static void test_limits(void **state)
{
    (void)state;
    static const char *const ladder[16] = {"lossless",           "int8",
                                           "int4-g32",           "int4-g64",
                                           "int4-g128",          "lossless+think-75",
                                           "int8+think-75",      "int4-g32+think-75",
                                           "int4-g64+think-75",  "int4-g128+think-75",
                                           "lossless+think-50",  "int8+think-50",
                                           "int4-g32+think-50",  "int4-g64+think-50",
                                           "int4-g128+think-50", "tc"};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    fprintf(f, "{\"kvedge_quality_profile\":1,\"model\":\"big\",\"layers\":%d,\"rungs\":[",
            KVEDGE_QUALITY_MAX_LAYERS);
    for (int r = 0; r < 16; r++)
        fprintf(f, "%s\"%s\"", r ? "," : "", ladder[r]);
    fprintf(f, "],\"per_layer\":[");
    const char *keys[3] = {"ppl_pct", "kl", "agreement"};
    for (int l = 0; l < KVEDGE_QUALITY_MAX_LAYERS; l++) {
        fprintf(f, "%s{\"layer\":%d", l ? "," : "", l);
        for (int k = 0; k < 3; k++) {
            fprintf(f, ",\"%s\":[", keys[k]);
            for (int r = 0; r < 16; r++)
                fprintf(f, "%s%.17g", r ? "," : "", k == 2 ? 1.0 : (l + 1) * 1e-3 * r);
            fputc(']', f);
        }
        fputc('}', f);
    }
    fprintf(f, "]}");
    fclose(f);
    kvedge_quality_profile_t *p = NULL;
    char why[256] = "";
    int rc = kvedge_quality_parse(buf, len, &p, why, sizeof why);
    if (rc != KVEDGE_OK)
        fail_msg("%s", why);
    assert_int_equal(kvedge_quality_layers(p), KVEDGE_QUALITY_MAX_LAYERS);
    assert_int_equal(kvedge_quality_n_rungs(p), 16);
    for (int r = 0; r < 16; r++) {
        kvedge_prec_t x = s_prec(ladder[r]);
        assert_true(kvedge_quality_has(p, x));
        double c;
        assert_int_equal(kvedge_quality_cost(p, 1023, x, KVEDGE_QUALITY_PPL_PCT, &c), KVEDGE_OK);
        /* Lossless is 0 although the file says otherwise for it (here it says 0 too). */
        assert_true(c == (x == KVEDGE_PREC_LOSSLESS ? 0 : 1024 * 1e-3 * r));
    }
    kvedge_quality_destroy(&p);
    free(buf);
}

/* A lossless row in the file that claims a cost: lossless still costs 0. */
static void test_lossless_listed(void **state)
{
    (void)state;
    const char js[] = "{\"kvedge_quality_profile\":1,\"model\":\"m\",\"layers\":1,"
                      "\"rungs\":[\"lossless\",\"int8\"],\"per_layer\":[{\"layer\":0,"
                      "\"ppl_pct\":[0.5,0.25],\"kl\":[0.1,0.2],\"agreement\":[0.5,0.9]}]}";
    kvedge_quality_profile_t *p = NULL;
    assert_int_equal(kvedge_quality_parse(js, strlen(js), &p, NULL, 0), KVEDGE_OK);
    assert_true(s_cost(p, 0, "lossless", KVEDGE_QUALITY_PPL_PCT) == 0);
    assert_true(s_cost(p, 0, "lossless", KVEDGE_QUALITY_KL) == 0);
    assert_true(s_cost(p, 0, "int8", KVEDGE_QUALITY_PPL_PCT) == 0.25);
    kvedge_quality_destroy(&p);
}

/* ---------------------------------------------------------------- budgets */

static void test_budget(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        kvedge_quality_metric_t m;
        double v;
    } good[] = {
        {"ppl:0.5%", KVEDGE_QUALITY_PPL_PCT, 0.5}, {"ppl:0.5", KVEDGE_QUALITY_PPL_PCT, 0.5},
        {"ppl:0", KVEDGE_QUALITY_PPL_PCT, 0},      {"ppl:100%", KVEDGE_QUALITY_PPL_PCT, 100},
        {"ppl:.25", KVEDGE_QUALITY_PPL_PCT, 0.25}, {"ppl:3e-1%", KVEDGE_QUALITY_PPL_PCT, 0.3},
        {"kl:1e-4", KVEDGE_QUALITY_KL, 1e-4},      {"kl:0", KVEDGE_QUALITY_KL, 0},
        {"kl:10", KVEDGE_QUALITY_KL, 10},          {"kl:0.002", KVEDGE_QUALITY_KL, 0.002},
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        kvedge_quality_metric_t m = (kvedge_quality_metric_t)9;
        double v = -1;
        if (kvedge_quality_budget_parse(good[i].s, &m, &v) != KVEDGE_OK)
            fail_msg("'%s' refused", good[i].s);
        assert_int_equal(m, good[i].m);
        assert_true(v == good[i].v);
    }
    static const char *const bad[] = {"",          "ppl",         "ppl:",      "ppl:%",
                                      "ppl:-0.5",  "ppl:100.5",   "ppl:1e3",   "ppl:0.5%%",
                                      "ppl:0.5x",  "ppl: 0.5",    "ppl:+0.5",  "ppl:nan",
                                      "ppl:inf",   "ppl:1e999",   "kl:1e-4%",  "kl:11",
                                      "kl:-1e-4",  "kl:",         "KL:1e-4",   "ppl=0.5",
                                      "agree:0.9", "ppl:0.5 ",    "kl:1e-400", "ppl:0x10",
                                      " ppl:0.5",  "kl:infinity", "none:0",    "None",
                                      "nonE"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvedge_quality_metric_t m = (kvedge_quality_metric_t)9;
        double v = -1;
        if (kvedge_quality_budget_parse(bad[i], &m, &v) != KVEDGE_EINVAL)
            fail_msg("'%s' accepted", bad[i]);
        assert_int_equal(m, 9);
        assert_true(v == -1);
    }
    kvedge_quality_metric_t m;
    double v;
    assert_int_equal(kvedge_quality_budget_parse(NULL, &m, &v), KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_budget_parse("kl:1", NULL, &v), KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_budget_parse("kl:1", &m, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_quality_budget_parse("none", &m, &v), KVEDGE_OK);
    assert_int_equal(m, KVEDGE_QUALITY_NONE);
    assert_true(v == 0);
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-test-quality-XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),   cmocka_unit_test(test_minimal),
        cmocka_unit_test(test_files),  cmocka_unit_test(test_bad),
        cmocka_unit_test(test_limits), cmocka_unit_test(test_lossless_listed),
        cmocka_unit_test(test_budget),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
