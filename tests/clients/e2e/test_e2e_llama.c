/* End to end (clients/e2e/e2e.h) with a tiny random Llama model with grouped-query attention,
 * made at test time (kvedge_decoder_synthesize_hf; no weights are committed): the cloud role
 * stores K/V per KV head, the edge fetches every layer from a store node and generates the
 * tokens full recomputation does; a context prefilled by a model with other rotary settings is
 * refused. */
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

#include "clients/decoder/decoder.h"
#include "clients/e2e/e2e.h"
#include "clients/lib/kvedge.h"
#include "store/node/node.h"

#define S_CTX      80 /* shared context tokens */
#define S_CHUNK    32 /* tokens per chunk: the last chunk is partial */
#define S_NCHUNK   3
#define S_PROMPT   12
#define S_NEW      6
#define S_DEADLINE 10000
/* Lossless fp32 context K/V: the same numbers as recomputed ones, summed in another order. */
#define S_TOL_LOSSLESS 1e-4f

static struct {
    char root[64], model_a[128], model_b[128], node_dir[128], node_ep[160];
    kvedge_decoder_t *a; /* rope_theta 10000 */
    kvedge_decoder_t *b; /* the same weights, rope_theta 500000 */
    kvedge_node_t *node;
    int32_t ctx[S_CTX], prompt[S_PROMPT];
} s_fx;

/* 3 layers, 4 query heads sharing 2 KV heads of 16, hidden 64. */
static const kvedge_decoder_config_t s_shape = {.layers = 3,
                                                .heads = 4,
                                                .head_dim = 16,
                                                .hidden = 64,
                                                .ffn = 96,
                                                .vocab = 300,
                                                .max_positions = 256,
                                                .kv_heads = 2};

static kvedge_decoder_t *s_load(const char *dir)
{
    kvedge_decoder_t *d = kvedge_decoder_new();
    assert_non_null(d);
    int rc = kvedge_decoder_load(d, dir, 0);
    if (rc != KVEDGE_OK)
        fail_msg("load %s: %s (%s)", dir, kvedge_strerror(rc), kvedge_decoder_error(d));
    return d;
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_fx.root, sizeof s_fx.root, "/tmp/kvedge-e2e-llama-XXXXXX");
    assert_non_null(mkdtemp(s_fx.root));
    snprintf(s_fx.model_a, sizeof s_fx.model_a, "%s/a", s_fx.root);
    snprintf(s_fx.model_b, sizeof s_fx.model_b, "%s/b", s_fx.root);
    assert_int_equal(
        kvedge_decoder_synthesize_hf(s_fx.model_a, "llama", &s_shape, 10000.0, false, 7, false),
        KVEDGE_OK);
    assert_int_equal(
        kvedge_decoder_synthesize_hf(s_fx.model_b, "llama", &s_shape, 500000.0, false, 7, false),
        KVEDGE_OK);
    s_fx.a = s_load(s_fx.model_a);
    s_fx.b = s_load(s_fx.model_b);
    assert_string_equal(kvedge_decoder_arch(s_fx.a), "llama");
    assert_int_equal(kvedge_decoder_kv_heads(s_fx.a), 2);
    assert_int_equal(kvedge_decoder_config(s_fx.a)->kv_heads, 2);
    for (uint32_t i = 0; i < S_CTX; i++)
        s_fx.ctx[i] = (int32_t)((i * 37 + 11) % s_shape.vocab);
    for (uint32_t i = 0; i < S_PROMPT; i++)
        s_fx.prompt[i] = (int32_t)((i * 53 + 5) % s_shape.vocab);

    snprintf(s_fx.node_dir, sizeof s_fx.node_dir, "%s/node", s_fx.root);
    snprintf(s_fx.node_ep, sizeof s_fx.node_ep, "ipc://%s/node.sock", s_fx.root);
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s", s_fx.node_dir);
    snprintf(ns.bind, sizeof ns.bind, "%s", s_fx.node_ep);
    snprintf(ns.name, sizeof ns.name, "cloud1");
    char why[256];
    if (kvedge_node_start(&ns, &s_fx.node, why, sizeof why) != KVEDGE_OK)
        fail_msg("start node: %s", why);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    kvedge_node_destroy(&s_fx.node);
    kvedge_decoder_destroy(&s_fx.a);
    kvedge_decoder_destroy(&s_fx.b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_fx.root);
    return system(cmd) == 0 ? 0 : -1;
}

static kvedge_client_t *s_client(void)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = s_fx.node_ep;
    o.deadline_ms = S_DEADLINE;
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    if (rc != KVEDGE_OK)
        fail_msg("connect %s: %s", s_fx.node_ep, kvedge_strerror(rc));
    return c;
}

static kvedge_e2e_request_t s_request(kvedge_e2e_mode_t mode, const kvedge_decoder_t *d,
                                      kvedge_client_t *c, const kvedge_model_t *m, float *logits)
{
    kvedge_e2e_request_t rq = {.mode = mode,
                               .decoder = d,
                               .ctx = s_fx.ctx,
                               .ctx_len = S_CTX,
                               .prompt = s_fx.prompt,
                               .prompt_len = S_PROMPT,
                               .max_new = S_NEW,
                               .proxy = c,
                               .model = m,
                               .chunk_tokens = S_CHUNK,
                               .deadline_ms = S_DEADLINE,
                               .logits = logits};
    return rq;
}

static void s_prefill(const kvedge_decoder_t *d, const kvedge_model_t *m, kvedge_scheme_t scheme)
{
    kvedge_client_t *c = s_client();
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    q.scheme = scheme;
    q.dtype = scheme == KVEDGE_SCHEME_LOSSLESS ? KVEDGE_DTYPE_FP32 : KVEDGE_DTYPE_FP16;
    kvedge_chunk_id_t ids[S_NCHUNK];
    kvedge_e2e_prefill_stats_t st;
    int rc = kvedge_e2e_prefill(c, d, m, s_fx.ctx, S_CTX, S_CHUNK, &q, ids, S_NCHUNK, &st);
    if (rc != KVEDGE_OK)
        fail_msg("prefill: %s", kvedge_strerror(rc));
    /* One block per (chunk, layer, KV head): 2 KV heads, not the 4 query heads. */
    assert_int_equal(st.n_chunks, S_NCHUNK);
    assert_int_equal(st.blocks, (uint64_t)S_NCHUNK * s_shape.layers * s_shape.kv_heads);
    assert_int_equal(st.fp16_bytes,
                     2ull * 2 * S_CTX * s_shape.layers * s_shape.kv_heads * s_shape.head_dim);
    kvedge_client_destroy(&c);
}

static float s_max_diff(const float *x, const float *y, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(x[i] - y[i]);
        if (!(d <= m))
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* GQA: a lossless prefill is stored per KV head, and a decode that fetches every layer from
 * the store node generates what recomputing the whole context on the edge does. */
static void test_gqa_fetched_matches_recompute(void **state)
{
    (void)state;
    kvedge_model_t m;
    assert_int_equal(kvedge_e2e_model(s_fx.a, "tiny-llama", &m), KVEDGE_OK);
    assert_int_equal(m.kv_heads, 2);
    assert_int_equal(m.layers, 3);
    assert_int_equal(m.head_dim, 16);
    s_prefill(s_fx.a, &m, KVEDGE_SCHEME_LOSSLESS);

    const uint32_t V = s_shape.vocab;
    float *ref = calloc(V, sizeof *ref), *got = calloc(V, sizeof *got);
    kvedge_e2e_result_t *r = calloc(1, sizeof *r);
    assert_non_null(ref);
    assert_non_null(got);
    assert_non_null(r);
    int32_t ref_tok[S_NEW], tok[S_NEW];
    kvedge_e2e_request_t rq = s_request(KVEDGE_E2E_LOCAL, s_fx.a, NULL, NULL, ref);
    assert_int_equal(kvedge_e2e_decode(&rq, ref_tok, r), KVEDGE_OK);
    assert_int_equal(r->computed, 3);

    kvedge_client_t *c = s_client();
    rq = s_request(KVEDGE_E2E_KVEDGE, s_fx.a, c, &m, got);
    int rc = kvedge_e2e_decode(&rq, tok, r);
    if (rc != KVEDGE_OK)
        fail_msg("decode: %s", kvedge_strerror(rc));
    assert_int_equal(r->fetched, 3);
    assert_int_equal(r->computed, 0);
    for (uint32_t l = 0; l < 3; l++)
        assert_false(r->layer[l].computed);
    float d = s_max_diff(ref, got, V);
    if (!(d <= S_TOL_LOSSLESS))
        fail_msg("fetched vs recomputed logits: max |delta| %g over %g", (double)d,
                 (double)S_TOL_LOSSLESS);
    assert_memory_equal(tok, ref_tok, sizeof tok);

    /* int8 goes through the same per-KV-head layout: every layer is fetched. */
    kvedge_model_t m8;
    assert_int_equal(kvedge_e2e_model(s_fx.a, "tiny-llama-int8", &m8), KVEDGE_OK);
    s_prefill(s_fx.a, &m8, KVEDGE_SCHEME_INT8);
    rq = s_request(KVEDGE_E2E_KVEDGE, s_fx.a, c, &m8, got);
    assert_int_equal(kvedge_e2e_decode(&rq, tok, r), KVEDGE_OK);
    assert_int_equal(r->fetched, 3);
    assert_true(s_max_diff(ref, got, V) < 5e-2f);
    kvedge_client_destroy(&c);
    free(r);
    free(got);
    free(ref);
}

/* The rotary settings are part of the model id: a model of the same shape with another
 * rope_theta gets another id, and its decoder refuses the first model's record. */
static void test_rope_mismatch_refused(void **state)
{
    (void)state;
    uint32_t fa = kvedge_decoder_rope_fingerprint(s_fx.a),
             fb = kvedge_decoder_rope_fingerprint(s_fx.b);
    assert_true(fa != 0 && fb != 0 && fa != fb);
    kvedge_model_t ma, mb;
    assert_int_equal(kvedge_e2e_model(s_fx.a, "same-shape", &ma), KVEDGE_OK);
    assert_int_equal(kvedge_e2e_model(s_fx.b, "same-shape", &mb), KVEDGE_OK);
    assert_int_equal(kvedge_e2e_model_rope(&ma), fa);
    assert_int_equal(kvedge_e2e_model_rope(&mb), fb);
    assert_string_not_equal(ma.id, mb.id);
    assert_int_equal(strncmp(ma.id, "same-shape@rope-", 16), 0);
    assert_int_equal(strlen(ma.id), strlen("same-shape") + KVEDGE_E2E_ROPE_SUFFIX_BYTES);
    /* An id already carrying a's suffix is kept for a and refused for b. */
    kvedge_model_t again;
    assert_int_equal(kvedge_e2e_model(s_fx.a, ma.id, &again), KVEDGE_OK);
    assert_string_equal(again.id, ma.id);
    assert_int_equal(kvedge_e2e_model(s_fx.b, ma.id, &again), KVEDGE_ESHAPE);
    /* An id with no room for the suffix. */
    char longid[KVEDGE_MODEL_ID_MAX_BYTES + 1];
    memset(longid, 'x', KVEDGE_MODEL_ID_MAX_BYTES);
    longid[KVEDGE_MODEL_ID_MAX_BYTES] = '\0';
    assert_int_equal(kvedge_e2e_model(s_fx.a, longid, &again), KVEDGE_EINVAL);

    s_prefill(s_fx.a, &ma, KVEDGE_SCHEME_LOSSLESS);
    /* b's prefill and decode with a's record: refused before anything is sent. */
    kvedge_client_t *c = s_client();
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    kvedge_chunk_id_t ids[S_NCHUNK];
    assert_int_equal(
        kvedge_e2e_prefill(c, s_fx.b, &ma, s_fx.ctx, S_CTX, S_CHUNK, &q, ids, S_NCHUNK, NULL),
        KVEDGE_ESHAPE);
    kvedge_e2e_result_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    int32_t tok[S_NEW];
    kvedge_e2e_request_t rq = s_request(KVEDGE_E2E_KVEDGE, s_fx.b, c, &ma, NULL);
    assert_int_equal(kvedge_e2e_decode(&rq, tok, r), KVEDGE_ESHAPE);
    /* b's own record names no context on the node: the store node does not know it. */
    kvedge_model_t known;
    assert_int_equal(kvedge_client_get_model(c, mb.id, &known), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_client_get_model(c, ma.id, &known), KVEDGE_OK);
    assert_int_equal(known.kv_heads, 2);
    /* The chunk chains differ, so b never reads a's blocks. */
    kvedge_chunk_id_t ca[S_NCHUNK], cb[S_NCHUNK];
    size_t na = 0, nb = 0;
    assert_int_equal(kvedge_e2e_chunks(&ma, s_fx.ctx, S_CTX, S_CHUNK, ca, S_NCHUNK, &na),
                     KVEDGE_OK);
    assert_int_equal(kvedge_e2e_chunks(&mb, s_fx.ctx, S_CTX, S_CHUNK, cb, S_NCHUNK, &nb),
                     KVEDGE_OK);
    assert_int_equal(na, nb);
    assert_memory_not_equal(ca, cb, sizeof ca);
    kvedge_client_destroy(&c);
    free(r);
}

/* OPT has learned positions: its id is the one given and its fingerprint 0. */
static void test_opt_id_unchanged(void **state)
{
    (void)state;
    kvedge_decoder_t *d = s_load(KVEDGE_FIXTURES "/opt_tiny.safetensors");
    assert_int_equal(kvedge_decoder_rope_fingerprint(d), 0);
    kvedge_model_t m;
    assert_int_equal(kvedge_e2e_model(d, "opt-tiny", &m), KVEDGE_OK);
    assert_string_equal(m.id, "opt-tiny");
    assert_int_equal(kvedge_e2e_model_rope(&m), 0);
    assert_int_equal(m.kv_heads, kvedge_decoder_config(d)->heads);
    /* A rotary suffix on an OPT model's id is some other model's. */
    kvedge_model_t ma;
    assert_int_equal(kvedge_e2e_model(s_fx.a, "x", &ma), KVEDGE_OK);
    assert_int_equal(kvedge_e2e_model(d, ma.id, &m), KVEDGE_ESHAPE);
    kvedge_decoder_destroy(&d);
}

/* What a proxy with no master knows of a rotary id named after a built-in shape. */
static void test_builtin_rope(void **state)
{
    (void)state;
    kvedge_model_t m;
    assert_int_equal(kvedge_model_id_rope("llama-3.2-1b@rope-0123abcd"), 0x0123abcdu);
    assert_int_equal(kvedge_model_builtin_rope("llama-3.2-1b@rope-0123abcd", &m), KVEDGE_OK);
    assert_string_equal(m.id, "llama-3.2-1b@rope-0123abcd");
    assert_int_equal(m.layers, 16);
    assert_int_equal(m.kv_heads, 8);
    assert_int_equal(m.head_dim, 64);
    assert_int_equal(m.dtype, KVEDGE_DTYPE_FP16);
    /* Not built in, no suffix, a malformed suffix. */
    assert_int_equal(kvedge_model_builtin_rope("tiny@rope-0123abcd", &m), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_model_builtin_rope("llama-3.2-1b", &m), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_model_builtin_rope("llama-3.2-1b@rope-0123ABCD", &m), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_model_builtin_rope("llama-3.2-1b@rope-123abcd", &m), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_model_builtin_rope("@rope-0123abcd", &m), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_model_builtin_rope(NULL, &m), KVEDGE_ENOMODEL);
    assert_int_equal(kvedge_model_id_rope(NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gqa_fetched_matches_recompute),
        cmocka_unit_test(test_rope_mismatch_refused),
        cmocka_unit_test(test_opt_id_unchanged),
        cmocka_unit_test(test_builtin_rope),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
