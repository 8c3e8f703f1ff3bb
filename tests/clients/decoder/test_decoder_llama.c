/* Tests of the decoder's Llama family (clients/decoder/decoder.c): Hugging Face model
 * directories written here (config.json and single or sharded F32 safetensors with seeded
 * random weights), grouped-query K/V shapes, the session engine on rotary models (fetched,
 * missed and in-place context K/V against a prefill), config.json refusals, and the errors of
 * bad shards and tensors, each naming its file. The logits themselves are checked against
 * llama.cpp by test_decoder_llamacpp. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "clients/decoder/decoder.h"
#include "clients/decoder/decoder_impl.h"
#include "access/codec/error.h"
#include "access/codec/model.h"

#define S_LAYERS 2
#define S_HIDDEN 32
#define S_HEADS  4
#define S_KV     2
#define S_HD     8
#define S_FFN    48
#define S_VOCAB  61
#define S_CTX    13
#define S_PROMPT 5
#define S_NEW    4
/* Fetched context K/V against a prefill: the same math, merged by log-sum-exp instead of one
 * softmax, so only fp32 rounding differs. */
#define S_TOL_SPLIT 1e-5f

/* ---- writing models ----------------------------------------------------------------------- */

typedef struct {
    char name[96];
    uint32_t d0, d1; /* d1 0: one dimension */
} s_tensor_t;

typedef struct {
    s_tensor_t t[64];
    size_t n;
} s_list_t;

static void s_add(s_list_t *l, uint32_t d0, uint32_t d1, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->t[l->n].name, sizeof l->t[l->n].name, fmt, ap);
    va_end(ap);
    l->t[l->n].d0 = d0;
    l->t[l->n].d1 = d1;
    l->n++;
    assert_true(l->n < 64);
}

/* The tensors of a Llama (qkv_bias: Qwen2) model of the test shape. */
static void s_tensors(s_list_t *l, bool qkv_bias, bool tied)
{
    l->n = 0;
    s_add(l, S_VOCAB, S_HIDDEN, "model.embed_tokens.weight");
    for (uint32_t i = 0; i < S_LAYERS; i++) {
        const char *p = "model.layers";
        s_add(l, S_HIDDEN, 0, "%s.%u.input_layernorm.weight", p, i);
        s_add(l, S_HEADS * S_HD, S_HIDDEN, "%s.%u.self_attn.q_proj.weight", p, i);
        s_add(l, S_KV * S_HD, S_HIDDEN, "%s.%u.self_attn.k_proj.weight", p, i);
        s_add(l, S_KV * S_HD, S_HIDDEN, "%s.%u.self_attn.v_proj.weight", p, i);
        s_add(l, S_HIDDEN, S_HEADS * S_HD, "%s.%u.self_attn.o_proj.weight", p, i);
        if (qkv_bias) {
            s_add(l, S_HEADS * S_HD, 0, "%s.%u.self_attn.q_proj.bias", p, i);
            s_add(l, S_KV * S_HD, 0, "%s.%u.self_attn.k_proj.bias", p, i);
            s_add(l, S_KV * S_HD, 0, "%s.%u.self_attn.v_proj.bias", p, i);
        }
        s_add(l, S_HIDDEN, 0, "%s.%u.post_attention_layernorm.weight", p, i);
        s_add(l, S_FFN, S_HIDDEN, "%s.%u.mlp.gate_proj.weight", p, i);
        s_add(l, S_FFN, S_HIDDEN, "%s.%u.mlp.up_proj.weight", p, i);
        s_add(l, S_HIDDEN, S_FFN, "%s.%u.mlp.down_proj.weight", p, i);
    }
    s_add(l, S_HIDDEN, 0, "model.norm.weight");
    if (!tied)
        s_add(l, S_VOCAB, S_HIDDEN, "lm_head.weight");
}

/* Writes tensors [from, to) of l to path as F32 safetensors, seeded uniform weights. */
static void s_write_st(const char *path, const s_list_t *l, size_t from, size_t to, uint32_t seed)
{
    char hdr[16384];
    size_t len = 0, off = 0;
    len += (size_t)snprintf(hdr + len, sizeof hdr - len, "{");
    for (size_t i = from; i < to; i++) {
        const s_tensor_t *t = &l->t[i];
        const size_t bytes = (size_t)t->d0 * (t->d1 ? t->d1 : 1) * 4;
        char shape[32];
        if (t->d1)
            snprintf(shape, sizeof shape, "[%u,%u]", t->d0, t->d1);
        else
            snprintf(shape, sizeof shape, "[%u]", t->d0);
        len +=
            (size_t)snprintf(hdr + len, sizeof hdr - len,
                             "%s\"%s\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                             i > from ? "," : "", t->name, shape, off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, sizeof hdr - len, "}");
    assert_true(len < sizeof hdr);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    const uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, len, f);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = from; i < to; i++) {
        const s_tensor_t *t = &l->t[i];
        const bool norm = t->d1 == 0 && strstr(t->name, "norm");
        for (size_t j = 0; j < (size_t)t->d0 * (t->d1 ? t->d1 : 1); j++) {
            x = x * 1664525u + 1013904223u;
            const float u = (float)(x >> 8) / (float)(1u << 24) - 0.5f; /* [-0.5, 0.5) */
            const float v = norm ? 1.0f + 0.2f * u : (t->d1 ? 2.0f * u / sqrtf((float)t->d1) : u);
            fwrite(&v, 4, 1, f);
        }
    }
    assert_int_equal(fclose(f), 0);
}

static void s_write_text(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* config.json of the test shape; extra is more fields (",\"k\":v" ...) or "". */
static void s_write_config(const char *dir, const char *model_type, bool tied, const char *extra)
{
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\":\"%s\",\"hidden_size\":%d,\"intermediate_size\":%d,"
             "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
             "\"hidden_act\":\"silu\",\"max_position_embeddings\":64,\"rms_norm_eps\":1e-5,"
             "\"rope_theta\":10000.0,\"tie_word_embeddings\":%s,\"vocab_size\":%d%s}",
             model_type, S_HIDDEN, S_FFN, S_LAYERS, S_HEADS, S_KV, tied ? "true" : "false", S_VOCAB,
             extra);
    s_write_text(dir, "config.json", cfg);
}

static char s_root[64];

/* A fresh directory under the test's temporary root. */
static void s_dir(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", s_root, name);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", out, out);
    assert_int_equal(system(cmd), 0);
}

/* A Llama model with Llama 3 rope_scaling, untied head, one file. */
static void s_make_llama(char *dir, size_t len)
{
    s_dir(dir, len, "llama");
    s_list_t l;
    s_tensors(&l, false, false);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    s_write_st(path, &l, 0, l.n, 1);
    s_write_config(dir, "llama", false,
                   ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0,"
                   "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
                   "\"original_max_position_embeddings\":16}");
}

/* A Qwen2 model (Q/K/V biases, tied head) in two shards with their index; index_extra is
 * added to weight_map (",\"name\":\"file\"" ...). */
static void s_make_qwen2(char *dir, size_t len, const char *name, const char *index_extra)
{
    s_dir(dir, len, name);
    s_list_t l;
    s_tensors(&l, true, true);
    const size_t half = l.n / 2;
    const char *file[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file[0]);
    s_write_st(path, &l, 0, half, 2);
    snprintf(path, sizeof path, "%s/%s", dir, file[1]);
    s_write_st(path, &l, half, l.n, 3);
    char ix[16384];
    size_t n = (size_t)snprintf(ix, sizeof ix, "{\"metadata\":{},\"weight_map\":{");
    for (size_t i = 0; i < l.n; i++)
        n += (size_t)snprintf(ix + n, sizeof ix - n, "%s\"%s\":\"%s\"", i ? "," : "", l.t[i].name,
                              file[i >= half]);
    snprintf(ix + n, sizeof ix - n, "%s}}", index_extra);
    s_write_text(dir, "model.safetensors.index.json", ix);
    s_write_config(
        dir, "qwen2", true,
        ",\"use_sliding_window\":false,\"sliding_window\":32768,\"max_window_layers\":2");
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_root, sizeof s_root, "/tmp/kvedge-declm-XXXXXX");
    return mkdtemp(s_root) ? 0 : -1;
}

static int s_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_root);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- shapes and the session engine -------------------------------------------------------- */

static kvedge_decoder_t *s_load(const char *dir)
{
    kvedge_decoder_t *md = kvedge_decoder_new();
    assert_non_null(md);
    int rc = kvedge_decoder_load(md, dir, 0);
    if (rc != KVEDGE_OK)
        fail_msg("load %s: %s (%s)", dir, kvedge_strerror(rc), kvedge_decoder_error(md));
    return md;
}

static void test_shapes(void **state)
{
    (void)state;
    char dir[256];
    s_make_llama(dir, sizeof dir);
    kvedge_decoder_t *md = s_load(dir);
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    assert_string_equal(kvedge_decoder_arch(md), "llama");
    assert_int_equal(c->layers, S_LAYERS);
    assert_int_equal(c->heads, S_HEADS);
    assert_int_equal(kvedge_decoder_kv_heads(md), S_KV);
    assert_int_equal(c->head_dim, S_HD);
    assert_int_equal(c->vocab, S_VOCAB);
    assert_int_equal(c->max_positions, 64);
    /* K/V are sized by the KV heads: [kv_heads][tokens][head_dim]. */
    assert_int_equal(kvedge_decoder_kv_floats(md, 10), S_KV * 10 * S_HD);
    kvedge_decoder_destroy(&md);

    s_make_qwen2(dir, sizeof dir, "qwen2", "");
    md = s_load(dir);
    assert_string_equal(kvedge_decoder_arch(md), "qwen2");
    assert_int_equal(kvedge_decoder_kv_heads(md), S_KV);
    kvedge_decoder_destroy(&md);

    /* An OPT file still loads as OPT, with as many KV heads as heads. */
    md = kvedge_decoder_new();
    assert_int_equal(kvedge_decoder_load(md, KVEDGE_FIXTURES "/opt_tiny.safetensors", 0), 0);
    assert_string_equal(kvedge_decoder_arch(md), "opt");
    assert_int_equal(kvedge_decoder_kv_heads(md), kvedge_decoder_config(md)->heads);

    /* ...and as a Hugging Face directory (config.json model_type opt), to the same logits. */
    const kvedge_decoder_config_t oc = *kvedge_decoder_config(md);
    s_dir(dir, sizeof dir, "opt");
    char cfg[256], path[512];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\":\"opt\",\"num_attention_heads\":%u,\"num_hidden_layers\":%u,"
             "\"activation_function\":\"relu\",\"do_layer_norm_before\":true}",
             oc.heads, oc.layers);
    s_write_text(dir, "config.json", cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(symlink(KVEDGE_FIXTURES "/opt_tiny.safetensors", path), 0);
    kvedge_decoder_t *md2 = s_load(dir);
    assert_string_equal(kvedge_decoder_arch(md2), "opt");
    assert_memory_equal(kvedge_decoder_config(md2), &oc, sizeof oc);
    const int32_t ids[4] = {3, 1, 4, 1};
    float *a = malloc(oc.vocab * sizeof(float)), *b = malloc(oc.vocab * sizeof(float));
    assert_true(a && b);
    assert_int_equal(kvedge_decoder_prefill(md, ids, 4, a, NULL, NULL), 0);
    assert_int_equal(kvedge_decoder_prefill(md2, ids, 4, b, NULL, NULL), 0);
    assert_memory_equal(a, b, oc.vocab * sizeof(float));
    kvedge_decoder_destroy(&md2);

    /* ...and as kvedge's own training folder (scripts/train_models.py): a config.json with no
     * model_type records the training run, and model.safetensors loads as the OPT file form. */
    s_write_text(dir, "config.json", "{\"layers\":2,\"steps\":700,\"heldout_loss\":4.0}");
    md2 = s_load(dir);
    assert_string_equal(kvedge_decoder_arch(md2), "opt");
    assert_memory_equal(kvedge_decoder_config(md2), &oc, sizeof oc);
    assert_int_equal(kvedge_decoder_prefill(md2, ids, 4, b, NULL, NULL), 0);
    assert_memory_equal(a, b, oc.vocab * sizeof(float));
    kvedge_decoder_destroy(&md2);
    /* Without weights beside it, the missing model_type is the error. */
    assert_int_equal(unlink(path), 0);
    md2 = kvedge_decoder_new();
    assert_int_equal(kvedge_decoder_load(md2, dir, 0), KVEDGE_ECORRUPT);
    assert_non_null(strstr(kvedge_decoder_error(md2), "model_type is missing"));
    kvedge_decoder_destroy(&md2);
    free(b);
    free(a);
    kvedge_decoder_destroy(&md);
}

typedef struct {
    const float *k, *v;
    size_t kvf;
    uint32_t miss_mask; /* bit l: report layer l as MISS */
} s_prov_t;

static int s_provide(void *arg, uint32_t l, float *k, float *v)
{
    const s_prov_t *p = arg;
    if (p->miss_mask & (1u << l))
        return KVEDGE_DECODER_MISS;
    memcpy(k, p->k + l * p->kvf, p->kvf * sizeof(float));
    memcpy(v, p->v + l * p->kvf, p->kvf * sizeof(float));
    return 0;
}

/* Decodes S_PROMPT tokens and S_NEW greedy ones over a context of S_CTX whose layers are
 * fetched from the prefill or missed per mask; logits of every step into out
 * [(1 + S_NEW)][vocab], tokens into gen. */
static void s_decode(const kvedge_decoder_t *md, const int32_t *ids, const float *k, const float *v,
                     uint32_t mask, float *out, int32_t *gen)
{
    const uint32_t V = kvedge_decoder_config(md)->vocab;
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(md);
    assert_non_null(s);
    s_prov_t p = {k, v, kvedge_decoder_kv_floats(md, S_CTX), mask};
    assert_int_equal(kvedge_decoder_session_begin(s, ids, S_CTX, s_provide, &p, ids + S_CTX,
                                                  S_PROMPT, S_NEW, out),
                     0);
    for (uint32_t i = 0; i < S_NEW; i++) {
        gen[i] = kvedge_decoder_argmax(kvedge_decoder_session_logits(s), V);
        assert_int_equal(kvedge_decoder_session_step(s, gen[i], out + (size_t)(i + 1) * V), 0);
    }
    kvedge_decoder_session_destroy(&s);
}

/* On a rotary GQA model: a decode over fetched context K/V agrees with one prefill of the whole
 * sequence; a MISS recompute gives the fetched K/V to the bit (K is stored post-rotary), so
 * decodes with any mix of fetched and missed layers are identical; greedy tokens match. */
static void s_session_case(const char *dir)
{
    kvedge_decoder_t *md = s_load(dir);
    const uint32_t V = kvedge_decoder_config(md)->vocab, L = kvedge_decoder_config(md)->layers;
    int32_t ids[S_CTX + S_PROMPT + S_NEW];
    for (uint32_t i = 0; i < S_CTX + S_PROMPT; i++)
        ids[i] = (int32_t)((i * 37u + 11u) % V);
    const size_t kvf = kvedge_decoder_kv_floats(md, S_CTX);
    float *k = malloc(L * kvf * sizeof(float)), *v = malloc(L * kvf * sizeof(float));
    float *fetched = malloc((size_t)(1 + S_NEW) * V * sizeof(float));
    float *missed = malloc((size_t)(1 + S_NEW) * V * sizeof(float));
    float *mixed = malloc((size_t)(1 + S_NEW) * V * sizeof(float));
    float *full = malloc(V * sizeof(float));
    assert_true(k && v && fetched && missed && mixed && full);
    assert_int_equal(kvedge_decoder_prefill(md, ids, S_CTX, NULL, k, v), 0);

    int32_t g1[S_NEW], g2[S_NEW], g3[S_NEW];
    s_decode(md, ids, k, v, 0, fetched, g1);
    s_decode(md, ids, k, v, ~0u, missed, g2);
    s_decode(md, ids, k, v, 2u, mixed, g3);
    assert_memory_equal(fetched, missed, (size_t)(1 + S_NEW) * V * sizeof(float));
    assert_memory_equal(fetched, mixed, (size_t)(1 + S_NEW) * V * sizeof(float));
    assert_memory_equal(g1, g2, sizeof g1);
    assert_memory_equal(g1, g3, sizeof g1);

    /* Against a prefill of context + prompt + the generated tokens at every step. */
    memcpy(ids + S_CTX + S_PROMPT, g1, sizeof g1);
    float worst = 0;
    for (uint32_t i = 0; i <= S_NEW; i++) {
        assert_int_equal(kvedge_decoder_prefill(md, ids, S_CTX + S_PROMPT + i, full, NULL, NULL),
                         0);
        for (uint32_t j = 0; j < V; j++) {
            const float d = fabsf(full[j] - fetched[(size_t)i * V + j]);
            worst = d > worst ? d : worst;
        }
        assert_int_equal(kvedge_decoder_argmax(full, V),
                         kvedge_decoder_argmax(fetched + (size_t)i * V, V));
    }
    printf("%s: split decode vs prefill max |d| %.3g\n", kvedge_decoder_arch(md), worst);
    assert_true(worst <= S_TOL_SPLIT);

    /* The prefill's K at position 0 is unrotated (angle 0), later positions are not: the cache
     * holds K after the rotation. Recompute layer 0's K of token 0 alone: equal at position 0. */
    float *k1 = malloc(L * kvedge_decoder_kv_floats(md, 1) * sizeof(float));
    float *v1 = malloc(L * kvedge_decoder_kv_floats(md, 1) * sizeof(float));
    assert_true(k1 && v1);
    assert_int_equal(kvedge_decoder_prefill(md, ids, 1, NULL, k1, v1), 0);
    for (uint32_t h = 0; h < kvedge_decoder_kv_heads(md); h++)
        assert_memory_equal(k1 + h * S_HD, k + (size_t)h * S_CTX * S_HD, S_HD * sizeof(float));
    free(v1);
    free(k1);
    free(full);
    free(mixed);
    free(missed);
    free(fetched);
    free(v);
    free(k);
    kvedge_decoder_destroy(&md);
}

static void test_session_llama(void **state)
{
    (void)state;
    char dir[256];
    s_make_llama(dir, sizeof dir);
    s_session_case(dir);
}

static void test_session_qwen2(void **state)
{
    (void)state;
    char dir[256];
    s_make_qwen2(dir, sizeof dir, "qwen2s", "");
    s_session_case(dir);
}

/* Positions matter: the same tokens shifted by one position give other logits (a model that
 * ignored the rotation would not notice). */
static void test_rotary_positions(void **state)
{
    (void)state;
    char dir[256];
    s_make_llama(dir, sizeof dir);
    kvedge_decoder_t *md = s_load(dir);
    const uint32_t V = S_VOCAB;
    int32_t a[3] = {5, 7, 9}, b[4] = {5, 5, 7, 9};
    float la[S_VOCAB], lb[S_VOCAB];
    assert_int_equal(kvedge_decoder_prefill(md, a, 3, la, NULL, NULL), 0);
    assert_int_equal(kvedge_decoder_prefill(md, b, 4, lb, NULL, NULL), 0);
    float d = 0;
    for (uint32_t j = 0; j < V; j++)
        d = fmaxf(d, fabsf(la[j] - lb[j]));
    assert_true(d > 1e-3f);
    kvedge_decoder_destroy(&md);
}

/* ---- config.json refusals ----------------------------------------------------------------- */

static int s_parse(const char *json, char *err, size_t len)
{
    kvedge_decoder_impl_hf_config_t hf;
    return kvedge_decoder_impl_parse_config(json, strlen(json), &hf, err, len);
}

#define S_BASE                                                                                     \
    "\"hidden_size\":64,\"intermediate_size\":96,\"num_hidden_layers\":2,"                         \
    "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":100,"                      \
    "\"max_position_embeddings\":32768"

static void test_config_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int rc;
        const char *says; /* in the error */
    } cases[] = {
        {"{\"model_type\":\"gemma2\"," S_BASE "}", KVEDGE_EINVAL, "model_type \"gemma2\""},
        {"{\"model_type\":\"mistral\"," S_BASE ",\"sliding_window\":4096}", KVEDGE_EINVAL,
         "sliding_window 4096"},
        {"{\"model_type\":\"qwen2\"," S_BASE ",\"use_sliding_window\":true}", KVEDGE_EINVAL,
         "use_sliding_window true"},
        {"{\"model_type\":\"llama\"," S_BASE ",\"kv_lora_rank\":512}", KVEDGE_EINVAL,
         "kv_lora_rank 512"},
        {"{\"model_type\":\"llama\"," S_BASE ",\"partial_rotary_factor\":0.5}", KVEDGE_EINVAL,
         "partial_rotary_factor 0.5"},
        {"{\"model_type\":\"llama\"," S_BASE ",\"attn_logit_softcapping\":50.0}", KVEDGE_EINVAL,
         "attn_logit_softcapping 50"},
        {"{\"model_type\":\"llama\"," S_BASE ",\"final_logit_softcapping\":30}", KVEDGE_EINVAL,
         "final_logit_softcapping 30"},
        {"{\"model_type\":\"mistral\"," S_BASE ",\"num_local_experts\":8}", KVEDGE_EINVAL,
         "num_local_experts 8"},
        {"{\"model_type\":\"qwen2\"," S_BASE ",\"num_experts\":60}", KVEDGE_EINVAL,
         "num_experts 60"},
        {"{\"model_type\":\"llama\"," S_BASE ",\"rope_scaling\":{\"rope_type\":\"yarn\"}}",
         KVEDGE_EINVAL, "rope_scaling.rope_type \"yarn\""},
        {"{\"model_type\":\"llama\"," S_BASE ",\"hidden_act\":\"gelu\"}", KVEDGE_EINVAL,
         "hidden_act \"gelu\""},
        {"{\"model_type\":\"llama\"," S_BASE ",\"mlp_bias\":true}", KVEDGE_EINVAL, "mlp_bias true"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
         "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":3,"
         "\"vocab_size\":100}",
         KVEDGE_ECORRUPT, "num_key_value_heads 3"},
        {"{\"model_type\":\"llama\",\"num_attention_heads\":4,\"num_hidden_layers\":2}",
         KVEDGE_ECORRUPT, "hidden_size is missing"},
        {"{\"model_type\":\"llama\"," S_BASE ",\"rope_scaling\":{\"rope_type\":\"llama3\"}}",
         KVEDGE_ECORRUPT, "rope_scaling (llama3)"},
        {"{\"model_type\":\"opt\",\"num_attention_heads\":12,\"activation_function\":\"gelu\"}",
         KVEDGE_EINVAL, "activation_function \"gelu\""},
        {"{\"model_type\":\"llama\",", KVEDGE_ECORRUPT, "not a JSON object"},
        {"[1,2]", KVEDGE_ECORRUPT, "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256];
        int rc = s_parse(cases[i].json, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].says))
            fail_msg("case %zu: %s -> %d \"%s\", expected %d \"%s\"", i, cases[i].json, rc, err,
                     cases[i].rc, cases[i].says);
    }
    /* What the published configs say loads: Llama 3.2 1B's and Qwen2.5 0.5B's (their
     * sliding_window unused), Mistral without a window, SmolLM2's llama. */
    static const char *const ok[] = {
        "{\"model_type\":\"llama\",\"hidden_size\":2048,\"intermediate_size\":8192,"
        "\"num_hidden_layers\":16,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
        "\"head_dim\":64,\"hidden_act\":\"silu\",\"max_position_embeddings\":131072,"
        "\"rms_norm_eps\":1e-05,\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":32.0,"
        "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
        "\"tie_word_embeddings\":true,\"vocab_size\":128256,\"attention_bias\":false,"
        "\"mlp_bias\":false}",
        "{\"model_type\":\"qwen2\",\"hidden_size\":896,\"intermediate_size\":4864,"
        "\"num_hidden_layers\":24,\"num_attention_heads\":14,\"num_key_value_heads\":2,"
        "\"hidden_act\":\"silu\",\"max_position_embeddings\":32768,\"max_window_layers\":21,"
        "\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,\"sliding_window\":32768,"
        "\"tie_word_embeddings\":true,\"use_sliding_window\":false,\"vocab_size\":151936}",
        "{\"model_type\":\"mistral\"," S_BASE ",\"sliding_window\":null}",
        "{\"model_type\":\"llama\"," S_BASE ",\"rope_scaling\":null,\"num_experts\":null}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char err[256];
        kvedge_decoder_impl_hf_config_t hf;
        int rc = kvedge_decoder_impl_parse_config(ok[i], strlen(ok[i]), &hf, err, sizeof err);
        if (rc != KVEDGE_OK)
            fail_msg("ok %zu: %s", i, err);
        if (i == 0) {
            assert_int_equal(hf.kv_heads, 8);
            assert_int_equal(hf.cfg.head_dim, 64);
            assert_true(hf.rope_llama3 && hf.rope_factor == 32.0 && hf.tie_embeddings);
        }
    }
    assert_int_equal(kvedge_decoder_impl_parse_config(NULL, 0, NULL, NULL, 0), KVEDGE_EINVAL);
}

/* ---- bad files ------------------------------------------------------------------------------- */

/* Loads dir expecting rc and an error that names file and says what. */
static void s_expect(const char *dir, uint32_t heads, int rc, const char *file, const char *what)
{
    kvedge_decoder_t *md = kvedge_decoder_new();
    assert_non_null(md);
    int got = kvedge_decoder_load(md, dir, heads);
    const char *err = kvedge_decoder_error(md);
    if (got != rc || !strstr(err, file) || !strstr(err, what))
        fail_msg("%s: %d \"%s\", expected %d naming %s and \"%s\"", dir, got, err, rc, file, what);
    assert_int_equal(kvedge_decoder_kv_heads(md), 0); /* nothing stays loaded */
    kvedge_decoder_destroy(&md);
}

static void test_bad_files(void **state)
{
    (void)state;
    char dir[256], path[512];
    /* The index maps a tensor to a shard that does not hold it. */
    s_make_qwen2(dir, sizeof dir, "badix",
                 ",\"model.extra.weight\":\"model-00001-of-00002.safetensors\"");
    s_expect(dir, 0, KVEDGE_ECORRUPT, "model-00001-of-00002.safetensors", "model.extra.weight");
    /* A shard holds a tensor the index does not list. */
    s_make_qwen2(dir, sizeof dir, "badshard", "");
    s_list_t l;
    s_tensors(&l, true, true);
    s_add(&l, 4, 0, "model.stray.weight");
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    s_write_st(path, &l, l.n / 2, l.n, 3);
    s_expect(dir, 0, KVEDGE_ECORRUPT, "model-00002-of-00002.safetensors", "model.stray.weight");
    /* A shard the index names is missing. */
    s_make_qwen2(dir, sizeof dir, "noshard", "");
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    s_expect(dir, 0, KVEDGE_EIO, "model-00002-of-00002.safetensors", "");
    /* A shard path that leaves the directory. */
    s_make_qwen2(dir, sizeof dir, "escape", ",\"x\":\"../model.safetensors\"");
    s_expect(dir, 0, KVEDGE_ECORRUPT, "model.safetensors.index.json", "names no shard file");

    /* A missing tensor (config says untied: lm_head.weight is needed). */
    s_make_llama(dir, sizeof dir);
    s_write_config(dir, "llama", false, "");
    s_tensors(&l, false, true);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    s_write_st(path, &l, 0, l.n, 1);
    s_expect(dir, 0, KVEDGE_ENOTFOUND, dir, "lm_head.weight is missing");
    /* A mis-shaped tensor: k_proj with as many rows as query heads (config says 2 KV heads). */
    s_tensors(&l, false, true);
    for (size_t i = 0; i < l.n; i++)
        if (strstr(l.t[i].name, "layers.1.self_attn.k_proj"))
            l.t[i].d0 = S_HEADS * S_HD;
    s_write_st(path, &l, 0, l.n, 1);
    s_write_config(dir, "llama", true, "");
    s_expect(dir, 0, KVEDGE_ESHAPE, dir, "model.layers.1.self_attn.k_proj.weight");
    /* A vocabulary larger than the embedding. */
    s_tensors(&l, false, true);
    s_write_st(path, &l, 0, l.n, 1);
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\":\"llama\",\"hidden_size\":%d,\"intermediate_size\":%d,"
             "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
             "\"vocab_size\":%d}",
             S_HIDDEN, S_FFN, S_LAYERS, S_HEADS, S_KV, S_VOCAB + 100);
    s_write_text(dir, "config.json", cfg);
    s_expect(dir, 0, KVEDGE_ESHAPE, "config.json", "larger than the embedding");
    /* More layers in the tensors than in config.json. */
    snprintf(cfg, sizeof cfg,
             "{\"model_type\":\"llama\",\"hidden_size\":%d,\"intermediate_size\":%d,"
             "\"num_hidden_layers\":1,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
             "\"vocab_size\":%d}",
             S_HIDDEN, S_FFN, S_HEADS, S_KV, S_VOCAB);
    s_write_text(dir, "config.json", cfg);
    s_expect(dir, 0, KVEDGE_ESHAPE, dir, "more layers than num_hidden_layers 1");
    /* A refused config, and heads that disagree with it. */
    s_write_config(dir, "llama", true, ",\"sliding_window\":8");
    s_expect(dir, 0, KVEDGE_EINVAL, "config.json", "sliding_window 8");
    s_write_config(dir, "llama", true, "");
    s_expect(dir, 7, KVEDGE_EINVAL, "config.json", "num_attention_heads 4");
    /* No config.json; no weights. */
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(unlink(path), 0);
    s_expect(dir, 0, KVEDGE_EIO, "config.json", "");
    s_write_config(dir, "llama", true, "");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    s_expect(dir, 0, KVEDGE_EIO, "model.safetensors", "");
    /* The GPU decoder is OPT's: a rotary model's weights are not handed to it. */
}

/* The built-in shapes of the edge models agree with their published config.json (the copies in
 * the fuzz corpus) as the decoder reads them: layers, KV heads, head_dim; and GQA's K/V per
 * token: Llama 3.2 1B holds 32 KiB of fp16 K/V per token against opt-1.3b's 192 KiB. */
static void test_builtin_shapes(void **state)
{
    (void)state;
    static const struct {
        const char *id, *config;
    } cases[] = {
        {"llama-3.2-1b", "llama32_1b.json"},
        {"qwen2.5-0.5b", "qwen25_05b.json"},
        {"smollm2-360m", "smollm2_360m.json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512], text[4096];
        snprintf(path, sizeof path, "%s/corpus/decoder_config/%s", KVEDGE_FUZZ_DIR,
                 cases[i].config);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        size_t n = fread(text, 1, sizeof text, f);
        fclose(f);
        kvedge_decoder_impl_hf_config_t hf;
        char err[256];
        assert_int_equal(kvedge_decoder_impl_parse_config(text, n, &hf, err, sizeof err), 0);
        kvedge_model_t m;
        assert_int_equal(kvedge_model_builtin(cases[i].id, &m), 0);
        assert_int_equal(m.layers, hf.cfg.layers);
        assert_int_equal(m.kv_heads, hf.kv_heads);
        assert_int_equal(m.head_dim, hf.cfg.head_dim);
        assert_int_equal(m.dtype, KVEDGE_DTYPE_BF16);
    }
    kvedge_model_t a, b;
    assert_int_equal(kvedge_model_builtin("llama-3.2-1b", &a), 0);
    assert_int_equal(kvedge_model_builtin("opt-1.3b", &b), 0);
    assert_int_equal(kvedge_model_fp16_bytes(&a, 1), 32u << 10);
    assert_int_equal(kvedge_model_fp16_bytes(&b, 1), 192u << 10);
    static const char *const more[] = {"llama-3.2-3b", "qwen2.5-1.5b"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(kvedge_model_builtin(more[i], &a), 0);
        assert_int_equal(kvedge_model_check(&a), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),          cmocka_unit_test(test_session_llama),
        cmocka_unit_test(test_session_qwen2),   cmocka_unit_test(test_rotary_positions),
        cmocka_unit_test(test_config_refusals), cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_builtin_shapes),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
