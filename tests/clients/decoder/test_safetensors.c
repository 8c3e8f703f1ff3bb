/* Tests of the safetensors reader: a round trip of a file written here, and every class of
 * malformed file getting its error code, a message, and no crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "clients/decoder/safetensors.h"
#include "access/codec/error.h"
#include "access/codec/half.h"

/* Builds a file image: the 8-byte length of header, header, then data_len bytes of data. */
static uint8_t *s_image(const char *header, const void *data, size_t data_len, size_t *len)
{
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    if (data_len)
        memcpy(b + 8 + h, data, data_len);
    return b;
}

/* Parses header + data_len zero bytes and returns the code; checks that a failure leaves a
 * message and an empty reader. */
static int s_parse_rc(const char *header, size_t data_len)
{
    uint8_t *zeros = calloc(1, data_len + 1);
    size_t len;
    uint8_t *img = s_image(header, zeros, data_len, &len);
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    assert_non_null(st);
    int rc = kvedge_safetensors_parse(st, img, len);
    if (rc != KVEDGE_OK) {
        assert_true(strlen(kvedge_safetensors_error(st)) > 0);
        assert_int_equal(kvedge_safetensors_count(st), 0);
        assert_null(kvedge_safetensors_find(st, "a"));
    }
    kvedge_safetensors_destroy(&st);
    free(img);
    free(zeros);
    return rc;
}

static void test_round_trip(void **state)
{
    (void)state;
    /* a: F32 [2][3], b: F16 [4], c: BF16 [2][2], z: an empty F32 [0][5]. */
    const float a[6] = {1.5f, -2.25f, 0.0f, 3.0e-8f, -1.0e20f, 0.125f};
    const float bvals[4] = {1.0f, -0.5f, 65504.0f, 5.9604645e-8f}; /* last: smallest subnormal */
    const float cvals[4] = {1.0f, -3.0e38f, 0.0078125f, -2.0f};
    uint8_t data[24 + 8 + 8];
    memcpy(data, a, sizeof a); /* the test host is little-endian, as the format */
    for (int i = 0; i < 4; i++) {
        uint16_t h = kvedge_f32_to_fp16(bvals[i]);
        memcpy(data + 24 + 2 * i, &h, 2);
        uint16_t g = kvedge_f32_to_bf16(cvals[i]);
        memcpy(data + 32 + 2 * i, &g, 2);
    }
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\",\"num_attention_heads\":\"4\"},"
                      "\"c\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[32,40]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[24,24]},"
                      "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[24,32]}}    ";
    size_t len;
    uint8_t *img = s_image(hdr, data, sizeof data, &len);
    char path[] = "/tmp/kvedge_st_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, img, len), (ssize_t)len);
    close(fd);

    for (int from_memory = 0; from_memory < 2; from_memory++) {
        kvedge_safetensors_t *st = kvedge_safetensors_new();
        assert_non_null(st);
        int rc = from_memory ? kvedge_safetensors_parse(st, img, len)
                             : kvedge_safetensors_open(st, path);
        assert_int_equal(rc, KVEDGE_OK);
        assert_string_equal(kvedge_safetensors_error(st), "");
        assert_int_equal(kvedge_safetensors_count(st), 4);
        /* In offset order; the empty tensor sorts between a and b. */
        assert_string_equal(kvedge_safetensors_at(st, 0)->name, "a");
        assert_string_equal(kvedge_safetensors_at(st, 3)->name, "c");
        assert_null(kvedge_safetensors_at(st, 4));

        const kvedge_safetensors_tensor_t *t = kvedge_safetensors_find(st, "a");
        assert_non_null(t);
        assert_int_equal(t->dtype, KVEDGE_SAFETENSORS_F32);
        assert_int_equal(t->ndim, 2);
        assert_int_equal(t->shape[0], 2);
        assert_int_equal(t->shape[1], 3);
        assert_int_equal(t->numel, 6);
        assert_int_equal(t->nbytes, 24);
        float out[8];
        assert_int_equal(kvedge_safetensors_to_f32(t, out, 8), KVEDGE_OK);
        assert_memory_equal(out, a, sizeof a);
        assert_int_equal(kvedge_safetensors_to_f32(t, out, 5), KVEDGE_ENOSPACE);

        t = kvedge_safetensors_find(st, "b");
        assert_non_null(t);
        assert_int_equal(t->dtype, KVEDGE_SAFETENSORS_F16);
        assert_int_equal(kvedge_safetensors_to_f32(t, out, 8), KVEDGE_OK);
        assert_memory_equal(out, bvals, sizeof bvals); /* all exactly representable */

        t = kvedge_safetensors_find(st, "c");
        assert_non_null(t);
        assert_int_equal(t->dtype, KVEDGE_SAFETENSORS_BF16);
        assert_int_equal(kvedge_safetensors_to_f32(t, out, 8), KVEDGE_OK);
        for (int i = 0; i < 4; i++)
            assert_true(out[i] == kvedge_bf16_to_f32(kvedge_f32_to_bf16(cvals[i])));
        assert_true(out[0] == 1.0f && out[3] == -2.0f);

        t = kvedge_safetensors_find(st, "z");
        assert_non_null(t);
        assert_int_equal(t->numel, 0);
        assert_int_equal(kvedge_safetensors_to_f32(t, out, 0), KVEDGE_OK);

        assert_null(kvedge_safetensors_find(st, "missing"));
        assert_null(kvedge_safetensors_find(st, "__metadata__"));
        assert_string_equal(kvedge_safetensors_metadata(st, "format"), "pt");
        assert_string_equal(kvedge_safetensors_metadata(st, "num_attention_heads"), "4");
        assert_null(kvedge_safetensors_metadata(st, "nope"));
        /* A reader holds one file. */
        assert_int_equal(kvedge_safetensors_open(st, path), KVEDGE_EINVAL);
        assert_int_equal(kvedge_safetensors_count(st), 4);
        kvedge_safetensors_destroy(&st);
        assert_null(st);
    }
    unlink(path);
    free(img);
}

static void test_degenerate(void **state)
{
    (void)state;
    kvedge_safetensors_destroy(NULL);
    kvedge_safetensors_t *st = NULL;
    kvedge_safetensors_destroy(&st);
    assert_int_equal(s_parse_rc("{}", 0), KVEDGE_OK);
    assert_int_equal(s_parse_rc("{\"__metadata__\":{}}", 0), KVEDGE_OK);
    assert_int_equal(kvedge_safetensors_dtype_size(KVEDGE_SAFETENSORS_BF16), 2);
    assert_null(kvedge_safetensors_dtype_name((kvedge_safetensors_dtype_t)9));
    assert_int_equal(kvedge_safetensors_count(NULL), 0);
    assert_null(kvedge_safetensors_find(NULL, "a"));

    st = kvedge_safetensors_new();
    assert_int_equal(kvedge_safetensors_open(st, "/nonexistent/model.safetensors"), KVEDGE_EIO);
    assert_non_null(strstr(kvedge_safetensors_error(st), "nonexistent"));
    assert_int_equal(kvedge_safetensors_open(st, "/tmp"), KVEDGE_EIO);
    assert_int_equal(kvedge_safetensors_parse(st, NULL, 4), KVEDGE_EINVAL);
    kvedge_safetensors_destroy(&st);
}

static void test_truncated(void **state)
{
    (void)state;
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    const uint8_t few[5] = {2, 0, 0, 0, 0};
    assert_int_equal(kvedge_safetensors_parse(st, few, sizeof few), KVEDGE_ETRUNCATED);
    assert_int_equal(kvedge_safetensors_parse(st, few, 0), KVEDGE_ETRUNCATED);
    /* Header length 64 but only 10 header bytes follow. */
    uint8_t past[18] = {64, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    assert_int_equal(kvedge_safetensors_parse(st, past, sizeof past), KVEDGE_ETRUNCATED);
    assert_non_null(strstr(kvedge_safetensors_error(st), "past"));

    /* A good file cut short inside its data: the offsets now run past the end. */
    const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    float data[4] = {1, 2, 3, 4};
    size_t len;
    uint8_t *img = s_image(hdr, data, sizeof data, &len);
    assert_int_equal(kvedge_safetensors_parse(st, img, len), KVEDGE_OK);
    kvedge_safetensors_destroy(&st);
    for (size_t cut = 0; cut < len; cut++) {
        st = kvedge_safetensors_new();
        int rc = kvedge_safetensors_parse(st, img, cut);
        assert_true(rc == KVEDGE_ETRUNCATED || rc == KVEDGE_ECORRUPT);
        kvedge_safetensors_destroy(&st);
    }

    /* Same through the file path: an empty file and a cut one. */
    char path[] = "/tmp/kvedge_st_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    st = kvedge_safetensors_new();
    assert_int_equal(kvedge_safetensors_open(st, path), KVEDGE_ETRUNCATED);
    kvedge_safetensors_destroy(&st);
    FILE *f = fopen(path, "wb");
    fwrite(img, 1, len - 3, f);
    fclose(f);
    st = kvedge_safetensors_new();
    assert_int_equal(kvedge_safetensors_open(st, path), KVEDGE_ECORRUPT);
    assert_non_null(strstr(kvedge_safetensors_error(st), "data"));
    kvedge_safetensors_destroy(&st);
    unlink(path);
    free(img);
}

static void test_header_length(void **state)
{
    (void)state;
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'}; /* 2^63 */
    assert_int_equal(kvedge_safetensors_parse(st, huge, sizeof huge), KVEDGE_ETOOBIG);
    uint64_t over = (uint64_t)KVEDGE_SAFETENSORS_MAX_HEADER_BYTES + 1;
    for (int i = 0; i < 8; i++)
        huge[i] = (uint8_t)(over >> (8 * i));
    assert_int_equal(kvedge_safetensors_parse(st, huge, sizeof huge), KVEDGE_ETOOBIG);
    memset(huge, 0xff, 8);
    assert_int_equal(kvedge_safetensors_parse(st, huge, sizeof huge), KVEDGE_ETOOBIG);
    kvedge_safetensors_destroy(&st);
}

static void test_bad_json(void **state)
{
    (void)state;
    assert_int_equal(s_parse_rc("", 0), KVEDGE_ECORRUPT);
    assert_int_equal(s_parse_rc("{\"a\":", 0), KVEDGE_ECORRUPT);
    assert_int_equal(s_parse_rc("[1,2]", 0), KVEDGE_ECORRUPT);
    assert_int_equal(s_parse_rc("{} x", 0), KVEDGE_ECORRUPT);
    assert_int_equal(s_parse_rc("{}{}", 0), KVEDGE_ECORRUPT);
    assert_int_equal(s_parse_rc("{\"a\":1}", 0), KVEDGE_ECORRUPT);
    assert_int_equal(s_parse_rc("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4), KVEDGE_ECORRUPT);
    assert_int_equal(s_parse_rc("{\"__metadata__\":{\"k\":1}}", 0), KVEDGE_ECORRUPT);
    assert_int_equal(s_parse_rc("{\"__metadata__\":[]}", 0), KVEDGE_ECORRUPT);
    /* A NUL inside the declared header is not JSON whitespace. */
    uint8_t nul[12] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' '};
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    assert_int_equal(kvedge_safetensors_parse(st, nul, sizeof nul), KVEDGE_ECORRUPT);
    kvedge_safetensors_destroy(&st);
}

static void test_dtype(void **state)
{
    (void)state;
    const char *types[] = {"I64", "F64", "U8", "BOOL", "F8_E4M3", "f32", "XYZ", ""};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char hdr[160];
        snprintf(hdr, sizeof hdr, "{\"a\":{\"dtype\":\"%s\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                 types[i]);
        uint8_t z[8] = {0};
        size_t len;
        uint8_t *img = s_image(hdr, z, sizeof z, &len);
        kvedge_safetensors_t *st = kvedge_safetensors_new();
        assert_int_equal(kvedge_safetensors_parse(st, img, len), KVEDGE_EINVAL);
        assert_non_null(strstr(kvedge_safetensors_error(st), "not supported"));
        kvedge_safetensors_destroy(&st);
        free(img);
    }
    assert_int_equal(s_parse_rc("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
                     KVEDGE_ECORRUPT);
}

static void test_shape_offsets(void **state)
{
    (void)state;
    /* Shape needs 16 bytes, offsets span 12. */
    assert_int_equal(
        s_parse_rc("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 12),
        KVEDGE_ECORRUPT);
    /* Shape product overflows 64 bits. */
    assert_int_equal(s_parse_rc("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                                "\"data_offsets\":[0,0]}}",
                                0),
                     KVEDGE_ECORRUPT);
    /* Negative, fractional, non-numeric and inexact (> 2^53) dimensions and offsets. */
    const char *bad[] = {
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e300]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18014398509481988]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(s_parse_rc(bad[i], 4), KVEDGE_ECORRUPT);
    /* Offsets out of range: past the 8 data bytes. */
    assert_int_equal(
        s_parse_rc("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8),
        KVEDGE_ECORRUPT);
    /* A scalar: shape [] holds one element. */
    assert_int_equal(
        s_parse_rc("{\"a\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,2]}}", 2),
        KVEDGE_OK);
}

static void test_overlap_holes(void **state)
{
    (void)state;
    /* Overlapping: b starts inside a. */
    assert_int_equal(s_parse_rc("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                                12),
                     KVEDGE_ECORRUPT);
    /* Identical ranges (aliasing) are an overlap too. */
    assert_int_equal(s_parse_rc("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                                8),
                     KVEDGE_ECORRUPT);
    /* A hole between tensors, and unindexed bytes at the end. */
    assert_int_equal(s_parse_rc("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                                12),
                     KVEDGE_ECORRUPT);
    assert_int_equal(
        s_parse_rc("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8),
        KVEDGE_ECORRUPT);
    /* The same name twice. */
    assert_int_equal(s_parse_rc("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                                8),
                     KVEDGE_ECORRUPT);
    /* Back to back in either key order is fine. */
    assert_int_equal(s_parse_rc("{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                                "\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
                                8),
                     KVEDGE_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),    cmocka_unit_test(test_degenerate),
        cmocka_unit_test(test_truncated),     cmocka_unit_test(test_header_length),
        cmocka_unit_test(test_bad_json),      cmocka_unit_test(test_dtype),
        cmocka_unit_test(test_shape_offsets), cmocka_unit_test(test_overlap_holes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
