/* Coding bases (access/codec/basis.h): a valid file parses and reads back, every check of the
 * layout refuses with its code and a reason, the process registry (one basis per model, ids
 * deduplicated, a fixed capacity) and loading a directory. The registry is process-wide: the
 * tests that register run in the order below, the one that fills it last. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/codec/basis.h"
#include "access/codec/byteorder.h"
#include "access/codec/error.h"
#include "access/codec/half.h"
#include "access/codec/model.h"
#include "tests/common/basis_fixture.h"

#define S_L 2
#define S_H 3
#define S_D 4

/* A small valid file (2 layers, 3 heads, D 4). */
static void s_file(const char *model, uint32_t seed, uint8_t **buf, size_t *len)
{
    assert_int_equal(kt_basis_file(model, S_L, S_H, S_D, 0.125f, seed, buf, len), 0);
}

/* Parses buf and expects rc, with a reason that contains `says` when given. */
static void s_refused(const uint8_t *buf, size_t len, int rc, const char *says)
{
    kvedge_basis_t *b = (kvedge_basis_t *)1;
    char why[256] = "";
    assert_int_equal(kvedge_basis_parse(buf, len, &b, why, sizeof why), rc);
    assert_null(b);
    assert_true(why[0] != '\0');
    if (says && !strstr(why, says))
        fail_msg("reason \"%s\" does not say \"%s\"", why, says);
}

static void test_parse_valid(void **state)
{
    (void)state;
    uint8_t *buf;
    size_t len;
    s_file("opt-125m", 1, &buf, &len);
    assert_int_equal(len, KVEDGE_BASIS_HEADER_BYTES + S_L * S_H * 2 * (4 + 6 * S_D * S_D) +
                              KVEDGE_BASIS_DIGEST_BYTES);
    kvedge_basis_t *b = NULL;
    char why[256] = "";
    assert_int_equal(kvedge_basis_parse(buf, len, &b, why, sizeof why), KVEDGE_OK);
    assert_non_null(b);
    assert_string_equal(kvedge_basis_model(b), "opt-125m");
    assert_int_equal(kvedge_basis_layers(b), S_L);
    assert_int_equal(kvedge_basis_kv_heads(b), S_H);
    assert_int_equal(kvedge_basis_head_dim(b), S_D);
    assert_int_equal(kvedge_basis_id(b), kvedge_le_get64(buf + len - KVEDGE_BASIS_DIGEST_BYTES));
    /* Every section reads back as written: step, fwd fp32, inv fp16 as fp32. */
    const uint8_t *p = buf + KVEDGE_BASIS_HEADER_BYTES;
    for (uint32_t l = 0; l < S_L; l++)
        for (uint32_t h = 0; h < S_H; h++)
            for (int w = 0; w < 2; w++) {
                kvedge_basis_section_t s;
                assert_int_equal(kvedge_basis_section(b, l, h, w, &s), KVEDGE_OK);
                assert_int_equal(s.dim, S_D);
                assert_true(s.step == 0.125f);
                p += 4;
                for (int i = 0; i < S_D * S_D; i++, p += 4)
                    assert_true(s.fwd[i] == kvedge_f32_from_bits(kvedge_le_get32(p)));
                for (int i = 0; i < S_D * S_D; i++, p += 2)
                    assert_true(s.inv[i] == kvedge_fp16_to_f32(kvedge_le_get16(p)));
            }
    kvedge_basis_section_t s;
    assert_int_equal(kvedge_basis_section(b, S_L, 0, 0, &s), KVEDGE_EINVAL);
    assert_int_equal(kvedge_basis_section(b, 0, S_H, 0, &s), KVEDGE_EINVAL);
    assert_int_equal(kvedge_basis_section(b, 0, 0, 2, &s), KVEDGE_EINVAL);
    assert_int_equal(kvedge_basis_section(NULL, 0, 0, 0, &s), KVEDGE_EINVAL);
    assert_int_equal(kvedge_basis_section(b, 0, 0, 0, NULL), KVEDGE_EINVAL);
    /* Another seed is another basis: another id. */
    uint8_t *buf2;
    size_t len2;
    s_file("opt-125m", 2, &buf2, &len2);
    kvedge_basis_t *b2 = NULL;
    assert_int_equal(kvedge_basis_parse(buf2, len2, &b2, NULL, 0), KVEDGE_OK);
    assert_true(kvedge_basis_id(b2) != kvedge_basis_id(b));
    kvedge_basis_free(&b2);
    kvedge_basis_free(&b);
    assert_null(b);
    kvedge_basis_free(&b); /* idempotent */
    kvedge_basis_free(NULL);
    assert_int_equal(kvedge_basis_parse(NULL, len, &b, NULL, 0), KVEDGE_EINVAL);
    assert_int_equal(kvedge_basis_parse(buf, len, NULL, NULL, 0), KVEDGE_EINVAL);
    free(buf2);
    free(buf);
}

/* A rotation basis (dense, fp16 inverse) is valid too, and its fwd inverts its inv. */
static void test_parse_rotation(void **state)
{
    (void)state;
    uint8_t *buf;
    size_t len;
    assert_int_equal(kt_basis_file_kind(KT_BASIS_ROTATION, "llama", 1, 1, 16, 0.05f, 7, &buf, &len),
                     0);
    kvedge_basis_t *b = NULL;
    assert_int_equal(kvedge_basis_parse(buf, len, &b, NULL, 0), KVEDGE_OK);
    kvedge_basis_section_t s;
    assert_int_equal(kvedge_basis_section(b, 0, 0, 1, &s), KVEDGE_OK);
    for (uint32_t r = 0; r < 16; r++)
        for (uint32_t c = 0; c < 16; c++) {
            double dot = 0;
            for (uint32_t j = 0; j < 16; j++)
                dot += (double)s.fwd[r * 16 + j] * s.inv[j * 16 + c];
            assert_true(fabs(dot - (r == c ? 1.0 : 0.0)) < 1e-5);
        }
    kvedge_basis_free(&b);
    free(buf);
}

static void test_truncated(void **state)
{
    (void)state;
    uint8_t *buf;
    size_t len;
    s_file("m", 1, &buf, &len);
    for (size_t n = 0; n < len; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, buf, n);
        s_refused(cut, n, KVEDGE_ETRUNCATED, "truncated");
        free(cut);
    }
    /* A byte past the end is no longer the header's length. */
    uint8_t *more = calloc(1, len + 1);
    memcpy(more, buf, len);
    s_refused(more, len + 1, KVEDGE_ECORRUPT, "past the end");
    free(more);
    free(buf);
}

static void test_flipped(void **state)
{
    (void)state;
    uint8_t *buf;
    size_t len;
    s_file("m", 1, &buf, &len);
    for (size_t i = KVEDGE_BASIS_HEADER_BYTES; i < len; i++) {
        buf[i] ^= 0x10;
        s_refused(buf, len, KVEDGE_ECORRUPT, "digest");
        buf[i] ^= 0x10;
    }
    /* Header bytes: each flip is refused, by its own check or the digest. */
    for (size_t i = 0; i < KVEDGE_BASIS_HEADER_BYTES; i++) {
        buf[i] ^= 0x01;
        kvedge_basis_t *b = NULL;
        char why[256] = "";
        const int rc = kvedge_basis_parse(buf, len, &b, why, sizeof why);
        assert_true(rc != KVEDGE_OK);
        assert_null(b);
        assert_true(why[0] != '\0');
        buf[i] ^= 0x01;
    }
    free(buf);
}

/* The header checks, each reached with a resealed digest so that the check itself speaks. */
static void test_header_checks(void **state)
{
    (void)state;
    uint8_t *buf;
    size_t len;
    s_file("m", 1, &buf, &len);
    uint8_t *t = malloc(len);
#define S_EDIT(stmt, rc, says)                                                                     \
    do {                                                                                           \
        memcpy(t, buf, len);                                                                       \
        stmt;                                                                                      \
        kt_basis_reseal(t, len);                                                                   \
        s_refused(t, len, rc, says);                                                               \
    } while (0)
    S_EDIT(t[0] = 'X', KVEDGE_ECORRUPT, "magic");
    S_EDIT(kvedge_le_put16(t + 8, 2), KVEDGE_EVERSION, "version");
    S_EDIT(kvedge_le_put16(t + 8, 0), KVEDGE_EVERSION, "version");
    S_EDIT(kvedge_le_put16(t + 10, 1), KVEDGE_ECORRUPT, "flags");
    S_EDIT(kvedge_le_put16(t + 10, 0x8000), KVEDGE_ECORRUPT, "flags");
    S_EDIT(kvedge_le_put16(t + 14, 1), KVEDGE_ECORRUPT, "reserved");
    S_EDIT(kvedge_le_put16(t + 12, 0), KVEDGE_ECORRUPT, "empty shape");
    S_EDIT(kvedge_le_put32(t + 16, 0), KVEDGE_ECORRUPT, "empty shape");
    S_EDIT(kvedge_le_put32(t + 20, 0), KVEDGE_ECORRUPT, "empty shape");
    S_EDIT(kvedge_le_put16(t + 12, KVEDGE_BLOCK_MAX_HEAD_DIM + 1), KVEDGE_ETOOBIG, "limits");
    S_EDIT(kvedge_le_put32(t + 16, KVEDGE_MODEL_MAX_LAYERS + 1), KVEDGE_ETOOBIG, "limits");
    S_EDIT(kvedge_le_put32(t + 20, KVEDGE_MODEL_MAX_HEADS + 1), KVEDGE_ETOOBIG, "limits");
    /* Within each limit, but too many bytes together. */
    S_EDIT((kvedge_le_put16(t + 12, 1024), kvedge_le_put32(t + 16, 64), kvedge_le_put32(t + 20, 8)),
           KVEDGE_ETOOBIG, "max");
    /* Shapes that agree with the limits but not with the length. */
    S_EDIT(kvedge_le_put32(t + 16, 3), KVEDGE_ETRUNCATED, "truncated");
    S_EDIT(kvedge_le_put32(t + 16, 1), KVEDGE_ECORRUPT, "past the end");
    S_EDIT(memset(t + 24, 0, 132), KVEDGE_ECORRUPT, "empty");
    S_EDIT(memset(t + 24, 'a', 132), KVEDGE_ECORRUPT, "no NUL");
    S_EDIT(memset(t + 24, 'a', 129), KVEDGE_ECORRUPT, "max 128");
    S_EDIT(t[24 + 5] = 'x', KVEDGE_ECORRUPT, "padding");
    /* A 128-byte id is the longest: valid. */
    memcpy(t, buf, len);
    memset(t + 24, 'a', 128);
    kt_basis_reseal(t, len);
    kvedge_basis_t *b = NULL;
    assert_int_equal(kvedge_basis_parse(t, len, &b, NULL, 0), KVEDGE_OK);
    assert_int_equal(strlen(kvedge_basis_model(b)), 128);
    kvedge_basis_free(&b);
    /* Over the size limit, whatever the bytes. */
    s_refused(t, (size_t)KVEDGE_BASIS_MAX_BYTES + 1, KVEDGE_ETOOBIG, "at most");
    free(t);
    free(buf);
}

static void s_put_float(uint8_t *p, float f)
{
    kvedge_le_put32(p, kvedge_f32_bits(f));
}

static void test_value_checks(void **state)
{
    (void)state;
    uint8_t *buf;
    size_t len;
    s_file("m", 1, &buf, &len);
    uint8_t *t = malloc(len);
    /* The last section (layer 1, head 2, V), so the walk reaches it. */
    const size_t sec = 4 + 6 * S_D * S_D;
    const size_t last = KVEDGE_BASIS_HEADER_BYTES + (S_L * S_H * 2 - 1) * sec;
    const size_t fwd = last + 4, inv = fwd + 4 * S_D * S_D;
    const float bad_steps[] = {0.0f, -0.125f, INFINITY, -INFINITY, NAN, 0.1f, 0x1.0p-20f, 70000.0f};
    for (size_t i = 0; i < sizeof bad_steps / sizeof bad_steps[0]; i++)
        S_EDIT(s_put_float(t + last, bad_steps[i]), KVEDGE_ECORRUPT, "step");
    S_EDIT(s_put_float(t + KVEDGE_BASIS_HEADER_BYTES, 0.0f), KVEDGE_ECORRUPT,
           "layer 0 head 0 K: step");
    /* 2^-14 is the smallest normal fp16 value, 65504 the largest. */
    const float good_steps[] = {0x1.0p-14f, 65504.0f, 0.099975586f};
    for (size_t i = 0; i < sizeof good_steps / sizeof good_steps[0]; i++) {
        memcpy(t, buf, len);
        s_put_float(t + last, good_steps[i]);
        kt_basis_reseal(t, len);
        kvedge_basis_t *b = NULL;
        assert_int_equal(kvedge_basis_parse(t, len, &b, NULL, 0), KVEDGE_OK);
        kvedge_basis_section_t s;
        assert_int_equal(kvedge_basis_section(b, S_L - 1, S_H - 1, 1, &s), KVEDGE_OK);
        assert_true(s.step == good_steps[i]);
        kvedge_basis_free(&b);
    }
    S_EDIT(s_put_float(t + fwd + 4 * 5, NAN), KVEDGE_ECORRUPT, "fwd[1][1] is not finite");
    S_EDIT(s_put_float(t + fwd, INFINITY), KVEDGE_ECORRUPT, "fwd[0][0] is not finite");
    S_EDIT(kvedge_le_put16(t + inv + 2 * 3, 0x7C00), KVEDGE_ECORRUPT, "inv[0][3] is not finite");
    S_EDIT(kvedge_le_put16(t + inv + 2 * 15, 0x7E00), KVEDGE_ECORRUPT, "inv[3][3] is not finite");
#undef S_EDIT
    free(t);
    free(buf);
}

static char s_dir[] = "/tmp/kvedge-basis-XXXXXX";

static void s_write_bytes(const char *name, const uint8_t *buf, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", s_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static void test_load(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/one.kvb", s_dir);
    assert_int_equal(kt_basis_write(path, "load-model", 1, 2, 8, 0.25f, 3), 0);
    kvedge_basis_t *b = NULL;
    char why[256] = "";
    assert_int_equal(kvedge_basis_load(path, &b, why, sizeof why), KVEDGE_OK);
    assert_string_equal(kvedge_basis_model(b), "load-model");
    kvedge_basis_free(&b);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(kvedge_basis_load(path, &b, why, sizeof why), KVEDGE_EIO);
    assert_non_null(strstr(why, path));
    assert_null(b);
    assert_int_equal(kvedge_basis_load(s_dir, &b, why, sizeof why), KVEDGE_EIO);
    assert_int_equal(kvedge_basis_load(NULL, &b, why, sizeof why), KVEDGE_EINVAL);
    /* A damaged file names itself and its check. */
    uint8_t *buf;
    size_t len;
    s_file("m", 1, &buf, &len);
    buf[len - 1] ^= 1;
    s_write_bytes("bad.kvb", buf, len);
    snprintf(path, sizeof path, "%s/bad.kvb", s_dir);
    assert_int_equal(kvedge_basis_load(path, &b, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "bad.kvb"));
    assert_non_null(strstr(why, "digest"));
    assert_int_equal(unlink(path), 0);
    free(buf);
}

/* Registry: register, find by id and by model, duplicates, one basis per model. */
static void test_registry(void **state)
{
    (void)state;
    uint8_t *buf;
    size_t len;
    s_file("reg-a", 1, &buf, &len);
    kvedge_basis_t *b = NULL, *dup = NULL, *other = NULL;
    assert_int_equal(kvedge_basis_parse(buf, len, &b, NULL, 0), KVEDGE_OK);
    const uint64_t id = kvedge_basis_id(b);
    assert_null(kvedge_basis_find(id));
    assert_null(kvedge_basis_find_model("reg-a"));
    assert_int_equal(kvedge_basis_register(&b), KVEDGE_OK);
    assert_null(b);
    const kvedge_basis_t *found = kvedge_basis_find(id);
    assert_non_null(found);
    assert_ptr_equal(kvedge_basis_find_model("reg-a"), found);
    assert_string_equal(kvedge_basis_model(found), "reg-a");
    assert_null(kvedge_basis_find_model("reg"));
    assert_null(kvedge_basis_find_model(NULL));
    assert_null(kvedge_basis_find(id + 1));
    /* The same basis again: freed, success, the first one stays. */
    assert_int_equal(kvedge_basis_parse(buf, len, &dup, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_basis_register(&dup), KVEDGE_OK);
    assert_null(dup);
    assert_ptr_equal(kvedge_basis_find(id), found);
    /* Another basis of the same model: refused, left to the caller. */
    uint8_t *buf2;
    size_t len2;
    s_file("reg-a", 2, &buf2, &len2);
    assert_int_equal(kvedge_basis_parse(buf2, len2, &other, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_basis_register(&other), KVEDGE_EAMBIGUOUS);
    assert_non_null(other);
    assert_null(kvedge_basis_find(kvedge_basis_id(other)));
    kvedge_basis_free(&other);
    assert_int_equal(kvedge_basis_register(NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_basis_register(&other), KVEDGE_EINVAL);
    free(buf2);
    free(buf);
}

static void test_load_dir(void **state)
{
    (void)state;
    char why[512] = "";
    size_t n = 99;
    /* Empty: nothing loaded. Files of other names are not read. */
    assert_int_equal(kvedge_basis_load_dir(s_dir, &n, why, sizeof why), KVEDGE_OK);
    assert_int_equal(n, 0);
    s_write_bytes("notes.txt", (const uint8_t *)"hi", 2);
    s_write_bytes(".hidden.kvb", (const uint8_t *)"hi", 2);
    char path[512];
    snprintf(path, sizeof path, "%s/b-two.kvb", s_dir);
    assert_int_equal(kt_basis_write(path, "dir-two", 1, 1, 4, 0.5f, 2), 0);
    snprintf(path, sizeof path, "%s/a-one.kvb", s_dir);
    assert_int_equal(kt_basis_write(path, "dir-one", 1, 1, 4, 0.5f, 1), 0);
    assert_int_equal(kvedge_basis_load_dir(s_dir, &n, why, sizeof why), KVEDGE_OK);
    assert_int_equal(n, 2);
    assert_non_null(kvedge_basis_find_model("dir-one"));
    assert_non_null(kvedge_basis_find_model("dir-two"));
    /* Again: duplicates, counted. */
    assert_int_equal(kvedge_basis_load_dir(s_dir, NULL, why, sizeof why), KVEDGE_OK);
    assert_int_equal(kvedge_basis_load_dir(s_dir, &n, NULL, 0), KVEDGE_OK);
    assert_int_equal(n, 2);
    /* A bad file stops the load where it is: named, the ones before it registered. */
    s_write_bytes("c-bad.kvb", (const uint8_t *)"KVEDGEKB", 8);
    snprintf(path, sizeof path, "%s/d-after.kvb", s_dir);
    assert_int_equal(kt_basis_write(path, "dir-after", 1, 1, 4, 0.5f, 4), 0);
    assert_int_equal(kvedge_basis_load_dir(s_dir, &n, why, sizeof why), KVEDGE_ETRUNCATED);
    assert_int_equal(n, 2);
    assert_non_null(strstr(why, "c-bad.kvb"));
    assert_non_null(strstr(why, "truncated"));
    assert_null(kvedge_basis_find_model("dir-after"));
    snprintf(path, sizeof path, "%s/c-bad.kvb", s_dir);
    assert_int_equal(unlink(path), 0);
    /* A second basis of a loaded model is refused by name. */
    snprintf(path, sizeof path, "%s/c-clash.kvb", s_dir);
    assert_int_equal(kt_basis_write(path, "dir-one", 1, 1, 4, 0.5f, 9), 0);
    assert_int_equal(kvedge_basis_load_dir(s_dir, &n, why, sizeof why), KVEDGE_EAMBIGUOUS);
    assert_non_null(strstr(why, "c-clash.kvb"));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(kvedge_basis_load_dir(s_dir, &n, why, sizeof why), KVEDGE_OK);
    assert_int_equal(n, 3);
    assert_non_null(kvedge_basis_find_model("dir-after"));
    /* A missing directory. */
    assert_int_equal(kvedge_basis_load_dir("/nonexistent/kvedge-bases", &n, why, sizeof why),
                     KVEDGE_EIO);
    assert_non_null(strstr(why, "/nonexistent/kvedge-bases"));
    assert_int_equal(kvedge_basis_load_dir(NULL, &n, why, sizeof why), KVEDGE_EINVAL);
}

/* Last: fills the registry (64 bases), then the next one is EFULL and a duplicate still
 * succeeds. */
static void test_registry_full(void **state)
{
    (void)state;
    int held = 0;
    for (int i = 0; i < KVEDGE_BASIS_MAX_LOADED + 1; i++) {
        char model[32];
        snprintf(model, sizeof model, "full-%d", i);
        uint8_t *buf;
        size_t len;
        assert_int_equal(kt_basis_file(model, 1, 1, 2, 1.0f, (uint32_t)i, &buf, &len), 0);
        kvedge_basis_t *b = NULL;
        assert_int_equal(kvedge_basis_parse(buf, len, &b, NULL, 0), KVEDGE_OK);
        free(buf);
        const int rc = kvedge_basis_register(&b);
        if (rc == KVEDGE_EFULL) {
            assert_non_null(b);
            kvedge_basis_free(&b);
            break;
        }
        assert_int_equal(rc, KVEDGE_OK);
        held++;
    }
    /* The registry held some from the tests before: full it is, at exactly its capacity. */
    assert_true(held < KVEDGE_BASIS_MAX_LOADED);
    assert_non_null(kvedge_basis_find_model("full-0"));
    assert_non_null(kvedge_basis_find_model("reg-a"));
    /* A duplicate of a registered basis is no new entry: still OK when full. */
    uint8_t *buf;
    size_t len;
    assert_int_equal(kt_basis_file("full-0", 1, 1, 2, 1.0f, 0, &buf, &len), 0);
    kvedge_basis_t *b = NULL;
    assert_int_equal(kvedge_basis_parse(buf, len, &b, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_basis_register(&b), KVEDGE_OK);
    assert_null(b);
    free(buf);
    /* load_dir on a full registry names the file and says full. */
    char path[512], why[512] = "";
    snprintf(path, sizeof path, "%s/z-full.kvb", s_dir);
    assert_int_equal(kt_basis_write(path, "one-too-many", 1, 1, 4, 0.5f, 1), 0);
    size_t n;
    assert_int_equal(kvedge_basis_load_dir(s_dir, &n, why, sizeof why), KVEDGE_EFULL);
    assert_non_null(strstr(why, "z-full.kvb"));
}

static int s_setup(void **state)
{
    (void)state;
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    (void)state;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_valid),   cmocka_unit_test(test_parse_rotation),
        cmocka_unit_test(test_truncated),     cmocka_unit_test(test_flipped),
        cmocka_unit_test(test_header_checks), cmocka_unit_test(test_value_checks),
        cmocka_unit_test(test_load),          cmocka_unit_test(test_registry),
        cmocka_unit_test(test_load_dir),      cmocka_unit_test(test_registry_full),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
