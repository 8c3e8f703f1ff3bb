/* llama.cpp's sequence state codec (clients/llamacpp/state.h), without llama.cpp: round trips
 * through the blob layout for both cache types, both V layouts, permuted and plain K, one and
 * several streams; the channel permutation and V transposition byte by byte on a hand-checked
 * case; and the refusals: another state version, a cell with extras, truncation, trailing
 * bytes, a layout that is not the blob's, a context that does not fit. The same blobs against
 * real llama.cpp: tests/clients/llamacpp/test_llamacpp_bridge.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "access/codec/error.h"
#include "access/codec/half.h"
#include "clients/llamacpp/state.h"

static kvedge_llamacpp_layout_t s_layout(bool permuted, int type, bool v_trans, uint32_t streams)
{
    kvedge_llamacpp_layout_t l = {.layers = 3,
                                  .kv_heads = 2,
                                  .head_dim = 8,
                                  .permuted = permuted,
                                  .type = type,
                                  .v_trans = v_trans,
                                  .n_stream = streams};
    return l;
}

static float *s_fill(size_t n, unsigned seed)
{
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((i * 2654435761u + seed) % 20011) / 2000.0f - 5.0f;
    return x;
}

static void test_round_trips(void **state)
{
    (void)state;
    const uint32_t n = 7;
    for (int type = 0; type <= 1; type++)
        for (int perm = 0; perm <= 1; perm++)
            for (int vt = 0; vt <= 1; vt++)
                for (uint32_t streams = 1; streams <= 3; streams += 2) {
                    kvedge_llamacpp_layout_t l = s_layout(perm, type, vt, streams);
                    const size_t f = (size_t)l.layers * l.kv_heads * n * l.head_dim;
                    float *k = s_fill(f, 1), *v = s_fill(f, 2);
                    float *k2 = calloc(f, sizeof *k2), *v2 = calloc(f, sizeof *v2);
                    size_t cap = kvedge_llamacpp_state_bytes(&l, n), len = 0;
                    assert_true(cap > 0);
                    uint8_t *blob = malloc(cap);
                    assert_int_equal(
                        kvedge_llamacpp_state_write(&l, 1, 5, n, k, v, blob, cap, &len), 0);
                    assert_int_equal(len, cap);
                    kvedge_llamacpp_state_info_t info;
                    assert_int_equal(kvedge_llamacpp_state_info(blob, len, &info), 0);
                    assert_int_equal(info.seq, 1);
                    assert_int_equal(info.cells, n);
                    assert_int_equal(info.pos0, 5);
                    assert_true(info.contiguous);
                    assert_int_equal(info.layers, 3);
                    assert_int_equal(info.n_stream, streams);
                    assert_int_equal(info.type, type);
                    assert_int_equal(info.v_trans, (bool)vt);
                    uint32_t got = 0;
                    int32_t pos0 = -1;
                    assert_int_equal(
                        kvedge_llamacpp_state_read(&l, blob, len, k2, v2, n, &got, &pos0), 0);
                    assert_int_equal(got, n);
                    assert_int_equal(pos0, 5);
                    for (size_t i = 0; i < f; i++) {
                        /* F16: the nearest half, exactly what the cache would hold. */
                        float ek = type ? kvedge_fp16_to_f32(kvedge_f32_to_fp16(k[i])) : k[i];
                        float ev = type ? kvedge_fp16_to_f32(kvedge_f32_to_fp16(v[i])) : v[i];
                        assert_true(k2[i] == ek);
                        assert_true(v2[i] == ev);
                    }
                    free(blob);
                    free(v2);
                    free(k2);
                    free(v);
                    free(k);
                }
}

/* One layer, one head of 4 channels, 2 tokens: K channel c of token t is 10 t + c in Hugging
 * Face's order; llama.cpp's order is 0, 2, 1, 3 (pairs (0, 2) and (1, 3) adjacent). V
 * transposed: channel-major. */
static void test_layout_bytes(void **state)
{
    (void)state;
    kvedge_llamacpp_layout_t l = {.layers = 1,
                                  .kv_heads = 1,
                                  .head_dim = 4,
                                  .permuted = true,
                                  .type = KVEDGE_LLAMACPP_F32,
                                  .v_trans = true,
                                  .n_stream = 1};
    const float k[8] = {0, 1, 2, 3, 10, 11, 12, 13};
    const float v[8] = {0, 1, 2, 3, 10, 11, 12, 13};
    uint8_t blob[256];
    size_t len = 0;
    assert_int_equal(kvedge_llamacpp_state_write(&l, 0, 0, 2, k, v, blob, sizeof blob, &len), 0);
    /* magic, seq, n_stream, count, 2 cells x 12, v_trans, n_layer, K type, K row (u64). */
    const size_t k_at = 16 + 24 + 8 + 12;
    float kb[8], vb[8];
    memcpy(kb, blob + k_at, sizeof kb);
    const float k_want[8] = {0, 2, 1, 3, 10, 12, 11, 13};
    for (int i = 0; i < 8; i++)
        assert_true(kb[i] == k_want[i]);
    const size_t v_at = k_at + sizeof kb + 12; /* V type, element bytes, width */
    memcpy(vb, blob + v_at, sizeof vb);
    const float v_want[8] = {0, 10, 1, 11, 2, 12, 3, 13};
    for (int i = 0; i < 8; i++)
        assert_true(vb[i] == v_want[i]);
    assert_int_equal(len, v_at + sizeof vb);
}

static void test_refusals(void **state)
{
    (void)state;
    const uint32_t n = 4;
    kvedge_llamacpp_layout_t l = s_layout(true, KVEDGE_LLAMACPP_F16, false, 1);
    const size_t f = (size_t)l.layers * l.kv_heads * n * l.head_dim;
    float *k = s_fill(f, 3), *v = s_fill(f, 4), *k2 = calloc(f, sizeof(float)),
          *v2 = calloc(f, sizeof(float));
    size_t cap = kvedge_llamacpp_state_bytes(&l, n), len = 0;
    uint8_t *blob = malloc(cap + 8);
    uint32_t got;
    int32_t pos0;
    assert_int_equal(kvedge_llamacpp_state_write(&l, 0, 0, n, k, v, blob, cap - 1, &len),
                     KVEDGE_ENOSPACE);
    assert_int_equal(kvedge_llamacpp_state_write(&l, -1, 0, n, k, v, blob, cap, &len),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_llamacpp_state_write(&l, 0, INT32_MAX - 1, n, k, v, blob, cap, &len),
                     KVEDGE_EINVAL);
    kvedge_llamacpp_layout_t q = l;
    q.type = 8; /* GGML_TYPE_Q8_0: a quantized cache */
    assert_int_equal(kvedge_llamacpp_layout_check(&q), KVEDGE_EINVAL);
    assert_int_equal(kvedge_llamacpp_state_write(&q, 0, 0, n, k, v, blob, cap, &len),
                     KVEDGE_EINVAL);
    q = l;
    q.head_dim = 7;
    assert_int_equal(kvedge_llamacpp_layout_check(&q), KVEDGE_EINVAL);
    assert_int_equal(kvedge_llamacpp_state_write(&l, 0, 0, n, k, v, blob, cap, &len), 0);

    /* Another version's magic. */
    blob[0] ^= 1;
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_EVERSION);
    blob[0] ^= 1;
    /* A cell with two sequence ids (or with per-cell extras, which read as one). */
    uint32_t two = 2;
    memcpy(blob + 16 + 4, &two, 4);
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_EVERSION);
    two = 1;
    memcpy(blob + 16 + 4, &two, 4);
    /* Every truncation, and a trailing byte. */
    for (size_t cut = 0; cut < len; cut += 7)
        assert_int_not_equal(kvedge_llamacpp_state_read(&l, blob, cut, k2, v2, n, &got, &pos0), 0);
    blob[len] = 0;
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, len + 1, k2, v2, n, &got, &pos0),
                     KVEDGE_ECORRUPT);
    /* A layout that is not the blob's: type, V layout, layer count. */
    q = l;
    q.type = KVEDGE_LLAMACPP_F32;
    assert_int_equal(kvedge_llamacpp_state_read(&q, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_ESHAPE);
    q = l;
    q.v_trans = true;
    assert_int_equal(kvedge_llamacpp_state_read(&q, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_ESHAPE);
    q = l;
    q.layers = 2;
    assert_int_equal(kvedge_llamacpp_state_read(&q, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_ESHAPE);
    /* The state carries a row's width only (kv_heads x head_dim): 1 x 16 reads as 2 x 8 would,
     * which is why the bridge checks the model before it reads or writes a state. */
    q = l;
    q.head_dim = 4;
    assert_int_equal(kvedge_llamacpp_state_read(&q, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_ESHAPE);
    /* More cells than the caller has room for. */
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, len, k2, v2, n - 1, &got, &pos0),
                     KVEDGE_ENOSPACE);
    /* A negative sequence id or position (the fuzzer's find: the header read them, the writer
     * refused them back); a last position past INT32_MAX is not contiguous, not an overflow. */
    int32_t neg = -30702, saved;
    memcpy(&saved, blob + 4, 4);
    memcpy(blob + 4, &neg, 4);
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_ECORRUPT);
    memcpy(blob + 4, &saved, 4);
    memcpy(&saved, blob + 16, 4);
    memcpy(blob + 16, &neg, 4);
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_ECORRUPT);
    int32_t top = INT32_MAX;
    memcpy(blob + 16, &top, 4);
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_ESHAPE);
    memcpy(blob + 16, &saved, 4);
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, len, k2, v2, n, &got, &pos0), 0);
    /* Positions with a gap. */
    int32_t p9 = 9;
    memcpy(blob + 16 + 12, &p9, 4);
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, len, k2, v2, n, &got, &pos0),
                     KVEDGE_ESHAPE);
    free(blob);
    free(v2);
    free(k2);
    free(v);
    free(k);
}

/* An empty sequence: the stream counts and nothing else. */
static void test_empty(void **state)
{
    (void)state;
    uint8_t blob[20];
    const uint32_t magic = KVEDGE_LLAMACPP_STATE_MAGIC, streams = 2, zero = 0;
    const int32_t seq = 1;
    memcpy(blob, &magic, 4);
    memcpy(blob + 4, &seq, 4);
    memcpy(blob + 8, &streams, 4);
    memcpy(blob + 12, &zero, 4);
    memcpy(blob + 16, &zero, 4);
    kvedge_llamacpp_state_info_t info;
    assert_int_equal(kvedge_llamacpp_state_info(blob, sizeof blob, &info), 0);
    assert_int_equal(info.cells, 0);
    assert_int_equal(info.n_stream, 2);
    kvedge_llamacpp_layout_t l = s_layout(false, KVEDGE_LLAMACPP_F32, false, 2);
    float k[1], v[1];
    uint32_t got = 9;
    int32_t pos0 = 9;
    assert_int_equal(kvedge_llamacpp_state_read(&l, blob, sizeof blob, k, v, 1, &got, &pos0), 0);
    assert_int_equal(got, 0);
    assert_int_equal(kvedge_llamacpp_state_info(blob, 10, &info), KVEDGE_ECORRUPT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_layout_bytes),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
