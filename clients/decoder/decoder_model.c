/* Model shapes, synthetic weights and cost estimates for the reference decoder (decoder.h):
 * the released OPT shapes by name, seeded random OPT checkpoints in safetensors for demos and
 * benchmarks, and per-layer time estimates from flop counts and costs measured on this machine. */
#include "clients/decoder/decoder.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "clients/decoder/decoder_impl.h"
#include "clients/decoder/safetensors.h"
#include "gpu/attn.h"
#include "access/codec/error.h"
#include "access/codec/half.h"
#include "access/codec/model.h"
#include "access/codec/synth.h"

/* OPT's initializer (init_std): every matrix and embedding is normal with this deviation. */
#define S_SYNTH_STD 0.02
/* Bytes generated and written per write(2). */
#define S_SYNTH_CHUNK_BYTES (1u << 20)
/* Largest hidden, ffn, vocab or positions synthesize accepts: real models are far below it,
 * and it keeps every size product inside 64 bits. */
#define S_SYNTH_MAX_DIM (1u << 24)
/* Longest tensor name: "model.decoder.layers.<n>.self_attn_layer_norm.weight". */
#define S_SYNTH_NAME_BYTES 96
/* JSON bytes per tensor entry beyond its name, generously: dtype, two shape numbers, two
 * offsets of up to 20 digits and punctuation. */
#define S_SYNTH_ENTRY_BYTES 160
/* Tensors outside the layers (embed_tokens, embed_positions, final_layer_norm weight and
 * bias), and per layer (two LayerNorms, four projections and two FFN matrices, each weight
 * and bias). */
#define S_SYNTH_TOP_TENSORS   4
#define S_SYNTH_LAYER_TENSORS 16

/* The cost measurement (kvedge_decoder_estimate): one-layer prefills of a short and a longer
 * run of tokens, and one causal attention over S_COST_ATTN_TOKENS; each the best of
 * S_COST_RUNS timed runs after a warm-up run (page faults, BLAS threads). */
#define S_COST_TOKENS_SHORT 16
#define S_COST_TOKENS_LONG  128
#define S_COST_ATTN_TOKENS  256
#define S_COST_RUNS         2

/* ---------------------------------------------------------------------------------------- */
/* Shapes                                                                                    */

typedef struct {
    const char *name;
    const char *arch; /* Hugging Face model_type */
    kvedge_decoder_config_t cfg;
    double rope_theta; /* Llama family */
    bool llama3;       /* Llama 3.2's rope_scaling (factor 32, low 1, high 4, original 8192) */
} s_shape_t;

/* The Hugging Face configs (facebook/opt-*); opt-tiny is tests/fixtures/opt_tiny.safetensors
 * as scripts/opt_reference.py writes it (VOCAB, HIDDEN, HEADS, LAYERS, FFN, MAX_POS). The Llama
 * family's from the published config.json of meta-llama/Llama-3.2-1B and -3B, Qwen/Qwen2.5-0.5B
 * and -1.5B, HuggingFaceTB/SmolLM2-360M (all with tied embeddings). Fields: layers, query heads,
 * head_dim, hidden, ffn, vocab, positions, KV heads. */
static const s_shape_t s_shapes[] = {
    {"opt-125m", "opt", {12, 12, 64, 768, 3072, 50272, 2048, 12}, 0, false},
    {"opt-1.3b", "opt", {24, 32, 64, 2048, 8192, 50272, 2048, 32}, 0, false},
    {"opt-2.7b", "opt", {32, 32, 80, 2560, 10240, 50272, 2048, 32}, 0, false},
    {"opt-tiny", "opt", {3, 4, 16, 64, 256, 256, 160, 4}, 0, false},
    {"llama-3.2-1b", "llama", {16, 32, 64, 2048, 8192, 128256, 131072, 8}, 500000.0, true},
    {"llama-3.2-3b", "llama", {28, 24, 128, 3072, 8192, 128256, 131072, 8}, 500000.0, true},
    {"qwen2.5-0.5b", "qwen2", {24, 14, 64, 896, 4864, 151936, 32768, 2}, 1000000.0, false},
    {"qwen2.5-1.5b", "qwen2", {28, 12, 128, 1536, 8960, 151936, 131072, 2}, 1000000.0, false},
    {"smollm2-360m", "llama", {32, 15, 64, 960, 2560, 49152, 8192, 5}, 100000.0, false},
};

static const s_shape_t *s_shape_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof s_shapes / sizeof s_shapes[0]; i++)
        if (strcmp(name, s_shapes[i].name) == 0)
            return &s_shapes[i];
    return NULL;
}

int kvedge_decoder_shape(const char *name, kvedge_decoder_config_t *out)
{
    const s_shape_t *s = s_shape_find(name);
    if (!s || !out)
        return KVEDGE_ENOMODEL;
    *out = s->cfg;
    return KVEDGE_OK;
}

const char *kvedge_decoder_shape_arch(const char *name)
{
    const s_shape_t *s = s_shape_find(name);
    return s ? s->arch : NULL;
}

const char *kvedge_decoder_shape_name(size_t i)
{
    return i < sizeof s_shapes / sizeof s_shapes[0] ? s_shapes[i].name : NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Synthetic weights                                                                         */

typedef enum {
    S_FILL_NORMAL, /* N(0, S_SYNTH_STD) */
    S_FILL_ONES,   /* LayerNorm weights */
    S_FILL_ZEROS,  /* biases */
} s_fill_t;

typedef struct {
    char name[S_SYNTH_NAME_BYTES];
    uint64_t d0, d1; /* d1 == 0: one dimension */
    s_fill_t fill;
} s_tensor_t;

/* A seeded stream of normals: Marsaglia's polar form of Box-Muller, both samples used. */
typedef struct {
    kvedge_rng_t rng;
    bool has_spare;
    double spare;
} s_gauss_t;

static double s_gauss(s_gauss_t *g)
{
    if (g->has_spare) {
        g->has_spare = false;
        return g->spare;
    }
    double u, v, s;
    do {
        u = (double)(kvedge_rng_next(&g->rng) >> 11) * 0x1.0p-52 - 1.0;
        v = (double)(kvedge_rng_next(&g->rng) >> 11) * 0x1.0p-52 - 1.0;
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = sqrt(-2.0 * log(s) / s);
    g->spare = v * f;
    g->has_spare = true;
    return u * f;
}

static bool s_shape_ok(const kvedge_decoder_config_t *c)
{
    if (c->layers == 0 || c->heads == 0 || c->hidden == 0 || c->ffn == 0 || c->vocab == 0 ||
        c->max_positions == 0)
        return false;
    if (c->layers > KVEDGE_MODEL_MAX_LAYERS || c->heads > KVEDGE_MODEL_MAX_HEADS ||
        c->hidden > S_SYNTH_MAX_DIM || c->ffn > S_SYNTH_MAX_DIM || c->vocab > S_SYNTH_MAX_DIM ||
        c->max_positions > S_SYNTH_MAX_DIM)
        return false;
    if (c->hidden % c->heads != 0)
        return false;
    return c->head_dim == 0 || c->head_dim == c->hidden / c->heads;
}

/* The tensor list of shape c, in file order; caller frees. NULL when out of memory. */
static s_tensor_t *s_tensor_list_hf(const kvedge_decoder_config_t *c, bool bias, size_t *count);

static s_tensor_t *s_tensor_list(const kvedge_decoder_config_t *c, size_t *count)
{
    const size_t n = S_SYNTH_TOP_TENSORS + (size_t)S_SYNTH_LAYER_TENSORS * c->layers;
    s_tensor_t *t = calloc(n, sizeof *t);
    if (!t)
        return NULL;
    const char *p = "model.decoder.";
    const uint64_t H = c->hidden, F = c->ffn;
    size_t i = 0;
#define S_ADD(a, b, f, ...)                                                                        \
    do {                                                                                           \
        snprintf(t[i].name, sizeof t[i].name, __VA_ARGS__);                                        \
        t[i].d0 = (a), t[i].d1 = (b), t[i].fill = (f), i++;                                        \
    } while (0)
    /* No lm_head.weight: OPT ties the head to embed_tokens, and the loader does the same. */
    S_ADD(c->vocab, H, S_FILL_NORMAL, "%sembed_tokens.weight", p);
    S_ADD((uint64_t)c->max_positions + KVEDGE_DECODER_POSITION_OFFSET, H, S_FILL_NORMAL,
          "%sembed_positions.weight", p);
    S_ADD(H, 0, S_FILL_ONES, "%sfinal_layer_norm.weight", p);
    S_ADD(H, 0, S_FILL_ZEROS, "%sfinal_layer_norm.bias", p);
    static const char *const proj[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    for (uint32_t l = 0; l < c->layers; l++) {
        S_ADD(H, 0, S_FILL_ONES, "%slayers.%" PRIu32 ".self_attn_layer_norm.weight", p, l);
        S_ADD(H, 0, S_FILL_ZEROS, "%slayers.%" PRIu32 ".self_attn_layer_norm.bias", p, l);
        for (int j = 0; j < 4; j++) {
            S_ADD(H, H, S_FILL_NORMAL, "%slayers.%" PRIu32 ".self_attn.%s.weight", p, l, proj[j]);
            S_ADD(H, 0, S_FILL_ZEROS, "%slayers.%" PRIu32 ".self_attn.%s.bias", p, l, proj[j]);
        }
        S_ADD(H, 0, S_FILL_ONES, "%slayers.%" PRIu32 ".final_layer_norm.weight", p, l);
        S_ADD(H, 0, S_FILL_ZEROS, "%slayers.%" PRIu32 ".final_layer_norm.bias", p, l);
        S_ADD(F, H, S_FILL_NORMAL, "%slayers.%" PRIu32 ".fc1.weight", p, l);
        S_ADD(F, 0, S_FILL_ZEROS, "%slayers.%" PRIu32 ".fc1.bias", p, l);
        S_ADD(H, F, S_FILL_NORMAL, "%slayers.%" PRIu32 ".fc2.weight", p, l);
        S_ADD(H, 0, S_FILL_ZEROS, "%slayers.%" PRIu32 ".fc2.bias", p, l);
    }
#undef S_ADD
    *count = i;
    return t;
}

/* The JSON header, padded with spaces so the data starts 8-byte aligned; caller frees.
 * NULL when out of memory. */
static char *s_header(const kvedge_decoder_config_t *c, const s_tensor_t *t, size_t count,
                      uint64_t seed, bool fp16, bool hf, size_t *len)
{
    const size_t cap = 1024 + count * (S_SYNTH_NAME_BYTES + S_SYNTH_ENTRY_BYTES);
    char *h = malloc(cap);
    if (!h)
        return NULL;
    /* A Hugging Face directory's shape is in its config.json. */
    size_t n =
        hf ? (size_t)snprintf(h, cap,
                              "{\"__metadata__\":{\"format\":\"pt\","
                              "\"kvedge_synthetic_seed\":\"%" PRIu64 "\"}",
                              seed)
           : (size_t)snprintf(
                 h, cap,
                 "{\"__metadata__\":{\"format\":\"pt\",\"num_attention_heads\":\"%" PRIu32 "\","
                 "\"num_hidden_layers\":\"%" PRIu32 "\",\"hidden_size\":\"%" PRIu32 "\","
                 "\"ffn_dim\":\"%" PRIu32 "\",\"vocab_size\":\"%" PRIu32 "\","
                 "\"max_position_embeddings\":\"%" PRIu32 "\",\"do_layer_norm_before\":\"true\","
                 "\"activation_function\":\"relu\",\"kvedge_synthetic_seed\":\"%" PRIu64 "\"}",
                 c->heads, c->layers, c->hidden, c->ffn, c->vocab, c->max_positions, seed);
    const size_t es = fp16 ? 2 : 4;
    uint64_t off = 0;
    for (size_t i = 0; i < count && n < cap; i++) {
        const uint64_t bytes = t[i].d0 * (t[i].d1 ? t[i].d1 : 1) * es;
        char shape[48];
        if (t[i].d1)
            snprintf(shape, sizeof shape, "%" PRIu64 ",%" PRIu64, t[i].d0, t[i].d1);
        else
            snprintf(shape, sizeof shape, "%" PRIu64, t[i].d0);
        n += (size_t)snprintf(h + n, cap - n,
                              ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%" PRIu64
                              ",%" PRIu64 "]}",
                              t[i].name, fp16 ? "F16" : "F32", shape, off, off + bytes);
        off += bytes;
    }
    if (n < cap)
        n += (size_t)snprintf(h + n, cap - n, "}");
    while (n % 8 != 0 && n + 1 < cap)
        h[n++] = ' ';
    if (n + 1 >= cap) { /* cannot happen with the bounds above; never write past h */
        free(h);
        return NULL;
    }
    h[n] = '\0';
    *len = n;
    return h;
}

/* write(2) of all len bytes; KVEDGE_EIO with errno set on failure. */
static int s_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return KVEDGE_EIO;
        }
        p += w;
        len -= (size_t)w;
    }
    return KVEDGE_OK;
}

/* Generates and writes one tensor's elements through the chunk buffer buf. Each tensor has
 * its own stream (seed, index), so its values do not depend on the others'. */
static int s_write_tensor(int fd, const s_tensor_t *t, size_t index, uint64_t seed, bool fp16,
                          uint8_t *buf)
{
    const size_t es = fp16 ? 2 : 4, per = S_SYNTH_CHUNK_BYTES / es;
    s_gauss_t g = {.has_spare = false};
    kvedge_rng_seed(&g.rng, seed ^ (0x9E3779B97F4A7C15ull * (index + 1)));
    uint64_t left = t->d0 * (t->d1 ? t->d1 : 1);
    while (left) {
        const size_t m = left < per ? (size_t)left : per;
        for (size_t i = 0; i < m; i++) {
            const float f = t->fill == S_FILL_NORMAL ? (float)(S_SYNTH_STD * s_gauss(&g))
                            : t->fill == S_FILL_ONES ? 1.0f
                                                     : 0.0f;
            /* Little-endian whatever the host. */
            const uint32_t bits = fp16 ? kvedge_f32_to_fp16(f) : kvedge_f32_bits(f);
            for (size_t b = 0; b < es; b++)
                buf[i * es + b] = (uint8_t)(bits >> (8 * b));
        }
        int rc = s_write_all(fd, buf, m * es);
        if (rc != KVEDGE_OK)
            return rc;
        left -= m;
    }
    return KVEDGE_OK;
}

/* Writes the safetensors file path (through path.tmp, renamed) of tensors t[0..count). */
static int s_write_file(const char *path, const kvedge_decoder_config_t *c, s_tensor_t *t,
                        size_t count, uint64_t seed, bool fp16, bool hf)
{
    size_t hlen = 0;
    char *hdr = t ? s_header(c, t, count, seed, fp16, hf, &hlen) : NULL;
    const size_t plen = strlen(path);
    char *tmp = malloc(plen + sizeof ".tmp");
    uint8_t *buf = malloc(S_SYNTH_CHUNK_BYTES);
    int rc = (t && hdr && tmp && buf) ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK && hlen > KVEDGE_SAFETENSORS_MAX_HEADER_BYTES)
        rc = KVEDGE_EINVAL;
    int fd = -1;
    if (rc == KVEDGE_OK) {
        memcpy(tmp, path, plen);
        memcpy(tmp + plen, ".tmp", sizeof ".tmp");
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            rc = KVEDGE_EIO;
    }
    if (rc == KVEDGE_OK) {
        uint8_t len8[8];
        for (int i = 0; i < 8; i++)
            len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
        rc = s_write_all(fd, len8, sizeof len8);
        if (rc == KVEDGE_OK)
            rc = s_write_all(fd, hdr, hlen);
        for (size_t i = 0; rc == KVEDGE_OK && i < count; i++)
            rc = s_write_tensor(fd, &t[i], i, seed, fp16, buf);
        if (close(fd) != 0 && rc == KVEDGE_OK)
            rc = KVEDGE_EIO;
        if (rc == KVEDGE_OK && rename(tmp, path) != 0)
            rc = KVEDGE_EIO;
        if (rc != KVEDGE_OK) {
            const int saved = errno;
            unlink(tmp);
            errno = saved;
        }
    }
    const int saved = errno;
    free(buf);
    free(tmp);
    free(hdr);
    free(t);
    errno = saved;
    return rc;
}

int kvedge_decoder_synthesize(const char *path, const kvedge_decoder_config_t *c, uint64_t seed,
                              bool fp16)
{
    if (!path || !*path || !c || !s_shape_ok(c) || (c->kv_heads && c->kv_heads != c->heads))
        return KVEDGE_EINVAL;
    size_t count = 0;
    s_tensor_t *t = s_tensor_list(c, &count);
    return s_write_file(path, c, t, count, seed, fp16, false);
}

/* ---- Llama-family synthetic models ---- */

/* Llama / Qwen2 tensors with HF's names: embed_tokens (tied head), the final RMSNorm, and per
 * layer two RMSNorms, q/k/v/o projections (Q/K/V biases for qwen2) and SwiGLU's gate, up,
 * down. */
static s_tensor_t *s_tensor_list_hf(const kvedge_decoder_config_t *c, bool bias, size_t *count)
{
    const size_t n = 2 + (size_t)12 * c->layers;
    s_tensor_t *t = calloc(n, sizeof *t);
    if (!t)
        return NULL;
    const uint64_t H = c->hidden, F = c->ffn, QD = (uint64_t)c->heads * c->head_dim,
                   KD = (uint64_t)c->kv_heads * c->head_dim;
    size_t i = 0;
#define S_ADD(a, b, f, ...)                                                                        \
    do {                                                                                           \
        snprintf(t[i].name, sizeof t[i].name, __VA_ARGS__);                                        \
        t[i].d0 = (a), t[i].d1 = (b), t[i].fill = (f), i++;                                        \
    } while (0)
    S_ADD(c->vocab, H, S_FILL_NORMAL, "model.embed_tokens.weight");
    S_ADD(H, 0, S_FILL_ONES, "model.norm.weight");
    for (uint32_t l = 0; l < c->layers; l++) {
        const char *p = "model.layers.";
        S_ADD(H, 0, S_FILL_ONES, "%s%" PRIu32 ".input_layernorm.weight", p, l);
        S_ADD(QD, H, S_FILL_NORMAL, "%s%" PRIu32 ".self_attn.q_proj.weight", p, l);
        S_ADD(KD, H, S_FILL_NORMAL, "%s%" PRIu32 ".self_attn.k_proj.weight", p, l);
        S_ADD(KD, H, S_FILL_NORMAL, "%s%" PRIu32 ".self_attn.v_proj.weight", p, l);
        S_ADD(H, QD, S_FILL_NORMAL, "%s%" PRIu32 ".self_attn.o_proj.weight", p, l);
        if (bias) {
            S_ADD(QD, 0, S_FILL_ZEROS, "%s%" PRIu32 ".self_attn.q_proj.bias", p, l);
            S_ADD(KD, 0, S_FILL_ZEROS, "%s%" PRIu32 ".self_attn.k_proj.bias", p, l);
            S_ADD(KD, 0, S_FILL_ZEROS, "%s%" PRIu32 ".self_attn.v_proj.bias", p, l);
        }
        S_ADD(H, 0, S_FILL_ONES, "%s%" PRIu32 ".post_attention_layernorm.weight", p, l);
        S_ADD(F, H, S_FILL_NORMAL, "%s%" PRIu32 ".mlp.gate_proj.weight", p, l);
        S_ADD(F, H, S_FILL_NORMAL, "%s%" PRIu32 ".mlp.up_proj.weight", p, l);
        S_ADD(H, F, S_FILL_NORMAL, "%s%" PRIu32 ".mlp.down_proj.weight", p, l);
    }
#undef S_ADD
    *count = i;
    return t;
}

static bool s_hf_shape_ok(const kvedge_decoder_config_t *c)
{
    if (c->layers == 0 || c->heads == 0 || c->kv_heads == 0 || c->head_dim == 0 ||
        c->head_dim % 2 != 0 || c->hidden == 0 || c->ffn == 0 || c->vocab == 0 ||
        c->max_positions == 0)
        return false;
    if (c->layers > KVEDGE_MODEL_MAX_LAYERS || c->heads > KVEDGE_MODEL_MAX_HEADS ||
        c->hidden > S_SYNTH_MAX_DIM || c->ffn > S_SYNTH_MAX_DIM || c->vocab > S_SYNTH_MAX_DIM ||
        c->max_positions > S_SYNTH_MAX_DIM || c->head_dim > S_SYNTH_MAX_DIM / c->heads)
        return false;
    return c->heads % c->kv_heads == 0;
}

int kvedge_decoder_synthesize_hf(const char *dir, const char *model_type,
                                 const kvedge_decoder_config_t *c, double rope_theta,
                                 bool llama3_scaling, uint64_t seed, bool fp16)
{
    if (!dir || !*dir || !model_type || !c || !s_hf_shape_ok(c) || !(rope_theta > 1.0) ||
        (strcmp(model_type, "llama") != 0 && strcmp(model_type, "qwen2") != 0))
        return KVEDGE_EINVAL;
    const bool qwen2 = strcmp(model_type, "qwen2") == 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return KVEDGE_EIO;
    const size_t dlen = strlen(dir);
    char *path = malloc(dlen + sizeof "/model.safetensors");
    if (!path)
        return KVEDGE_ENOMEM;
    char scaling[192] = "null";
    if (llama3_scaling)
        snprintf(scaling, sizeof scaling,
                 "{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,"
                 "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}");
    snprintf(path, dlen + sizeof "/model.safetensors", "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    int rc = f ? KVEDGE_OK : KVEDGE_EIO;
    if (f) {
        fprintf(f,
                "{\"model_type\":\"%s\",\"architectures\":[\"%s\"],\"hidden_act\":\"silu\","
                "\"hidden_size\":%" PRIu32 ",\"intermediate_size\":%" PRIu32
                ",\"num_hidden_layers\":%" PRIu32 ",\"num_attention_heads\":%" PRIu32
                ",\"num_key_value_heads\":%" PRIu32 ",\"head_dim\":%" PRIu32
                ",\"vocab_size\":%" PRIu32 ",\"max_position_embeddings\":%" PRIu32
                ",\"rms_norm_eps\":%s,\"rope_theta\":%.1f,\"rope_scaling\":%s,"
                "\"tie_word_embeddings\":true,\"torch_dtype\":\"%s\","
                "\"kvedge_synthetic_seed\":%" PRIu64 "}\n",
                model_type, qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM", c->hidden, c->ffn,
                c->layers, c->heads, c->kv_heads, c->head_dim, c->vocab, c->max_positions,
                qwen2 ? "1e-06" : "1e-05", rope_theta, scaling, fp16 ? "float16" : "float32", seed);
        if (fclose(f) != 0)
            rc = KVEDGE_EIO;
    }
    if (rc == KVEDGE_OK) {
        snprintf(path, dlen + sizeof "/model.safetensors", "%s/model.safetensors", dir);
        size_t count = 0;
        s_tensor_t *t = s_tensor_list_hf(c, qwen2, &count);
        rc = s_write_file(path, c, t, count, seed, fp16, true);
    }
    const int saved = errno;
    free(path);
    errno = saved;
    return rc;
}

int kvedge_decoder_synthesize_shape(const char *name, const char *out, uint64_t seed, bool fp16)
{
    const s_shape_t *s = s_shape_find(name);
    if (!s)
        return KVEDGE_ENOMODEL;
    if (strcmp(s->arch, "opt") == 0)
        return kvedge_decoder_synthesize(out, &s->cfg, seed, fp16);
    return kvedge_decoder_synthesize_hf(out, s->arch, &s->cfg, s->rope_theta, s->llama3, seed,
                                        fp16);
}

/* ---------------------------------------------------------------------------------------- */
/* Costs                                                                                     */

uint64_t kvedge_decoder_weights_bytes(const kvedge_decoder_t *self)
{
    return kvedge_decoder_impl_weight_bytes(self);
}

/* The two parts of a layer pass of n new tokens attending to ctx fully visible keys and
 * causally to themselves: flops of the projections and FFN (2 M N K per matrix product), and
 * the attention scores (query-key pairs over all heads; query i sees ctx + i + 1 keys). */
static double s_dense_flops(const kvedge_decoder_config_t *c, double n)
{
    const double H = c->hidden, F = c->ffn;
    return 4 * 2 * n * H * H + 2 * 2 * n * H * F;
}

static double s_scores(const kvedge_decoder_config_t *c, double n, double ctx)
{
    return c->heads * (n * ctx + n * (n + 1) / 2);
}

void kvedge_decoder_layer_flops(const kvedge_decoder_config_t *c, uint32_t ctx_len,
                                uint32_t prompt_len, double *compute, double *recompute)
{
    /* A score costs 2 head_dim flops in Q K^T and as many in P V. */
    const double per_score = c ? 4.0 * c->head_dim : 0;
    if (compute)
        *compute =
            c ? s_dense_flops(c, prompt_len) + per_score * s_scores(c, prompt_len, ctx_len) : 0;
    if (recompute)
        *recompute = c ? s_dense_flops(c, ctx_len) + per_score * s_scores(c, ctx_len, 0) : 0;
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best time of a one-layer prefill of n tokens. */
static int s_time_layer(const kvedge_decoder_t *md, uint32_t n, double *best)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    int32_t tokens[S_COST_TOKENS_LONG];
    for (uint32_t i = 0; i < n; i++)
        tokens[i] = (int32_t)(((uint64_t)i * 7919u + 13u) % c->vocab);
    int rc = kvedge_decoder_impl_prefill_layers(md, tokens, n, 1);
    *best = INFINITY;
    for (int r = 0; rc == KVEDGE_OK && r < S_COST_RUNS; r++) {
        const double t0 = s_now();
        rc = kvedge_decoder_impl_prefill_layers(md, tokens, n, 1);
        const double dt = s_now() - t0;
        *best = dt < *best ? dt : *best;
    }
    return rc;
}

/* Best time of the decoder's attention (gpu/attn.h, CPU) over n tokens, causal, all heads. */
static int s_time_attention(const kvedge_decoder_config_t *c, uint32_t n, double *best)
{
    const size_t elems = (size_t)c->heads * n * c->head_dim;
    float *buf = malloc((4 * elems + (size_t)c->heads * n) * sizeof(float));
    if (!buf)
        return KVEDGE_ENOMEM;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, n);
    for (size_t i = 0; i < 3 * elems; i++)
        buf[i] = (float)(kvedge_rng_next(&r) >> 40) * 0x1.0p-24f - 0.5f;
    const kvedge_attn_partial_args_t a = {
        .dtype = KVEDGE_DTYPE_FP32,
        .q = buf,
        .k = buf + elems,
        .v = buf + 2 * elems,
        .heads = c->heads,
        .nq = n,
        .n = n,
        .head_dim = c->head_dim,
        .scale = 1.0f / sqrtf((float)c->head_dim),
        .causal = true,
        .o = buf + 3 * elems,
        .lse = buf + 4 * elems,
    };
    int rc = kvedge_cpu_attn_partial(&a);
    *best = INFINITY;
    for (int i = 0; rc == KVEDGE_OK && i < S_COST_RUNS; i++) {
        const double t0 = s_now();
        rc = kvedge_cpu_attn_partial(&a);
        const double dt = s_now() - t0;
        *best = dt < *best ? dt : *best;
    }
    free(buf);
    return rc;
}

/* The cost model's three numbers: seconds per score from a bare attention; then the time of
 * a short and a long one-layer prefill, less their attention, on a line through their dense
 * flops: the slope is the dense rate, the intercept the fixed cost of a pass. */
static int s_measure(const kvedge_decoder_t *md, kvedge_decoder_impl_cost_t *cost)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    const uint32_t P = c->max_positions;
    const uint32_t na = P < S_COST_ATTN_TOKENS ? P : S_COST_ATTN_TOKENS;
    const uint32_t nl = P < S_COST_TOKENS_LONG ? P : S_COST_TOKENS_LONG;
    const uint32_t ns = nl / 2 < S_COST_TOKENS_SHORT ? nl / 2 : S_COST_TOKENS_SHORT;
    double ta, tl, ts = 0;
    int rc = s_time_attention(c, na, &ta);
    if (rc == KVEDGE_OK)
        rc = s_time_layer(md, nl, &tl);
    if (rc == KVEDGE_OK && ns > 0)
        rc = s_time_layer(md, ns, &ts);
    if (rc != KVEDGE_OK)
        return rc;
    /* A clock too coarse to see a run must not give an infinite rate. */
    const double tick = 1e-9;
    cost->score_s = ta / s_scores(c, na, 0);
    const double dl = fmax(tl - cost->score_s * s_scores(c, nl, 0), tick);
    const double ds = ns ? fmax(ts - cost->score_s * s_scores(c, ns, 0), tick) : 0;
    const double fl = s_dense_flops(c, nl), fs = s_dense_flops(c, ns);
    if (ns > 0 && dl > ds) {
        cost->dense_rate = (fl - fs) / (dl - ds);
        cost->fixed_s = fmax(ds - fs / cost->dense_rate, 0);
    } else { /* one point (a model too short for two), or timings the noise inverted */
        cost->dense_rate = fl / dl;
        cost->fixed_s = 0;
    }
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Learned speed                                                                             */

enum { S_KIND_COMPUTE, S_KIND_RECOMPUTE, S_KINDS = KVEDGE_DECODER_IMPL_KINDS };

/* The learned state lives on the model (decoder.c, kvedge_decoder_impl_learned); these
 * callbacks run under its lock. */
typedef struct {
    double f[S_KINDS]; /* estimate: the factors to apply */
} s_factors_t;

static void s_read_factors(void *arg, kvedge_decoder_impl_learn_t *l)
{
    s_factors_t *f = arg;
    for (int i = 0; i < S_KINDS; i++)
        f->f[i] = exp(l->log_f[i]);
}

typedef struct {
    const double *r; /* observed / prior, log, clamped; per kind */
    const bool *use;
} s_observe_t;

static void s_fold(void *arg, kvedge_decoder_impl_learn_t *l)
{
    const s_observe_t *o = arg;
    const double step = KVEDGE_DECODER_LEARN_STEP_MAX;
    for (int i = 0; i < S_KINDS; i++) {
        if (!o->use[i])
            continue;
        l->log_f[i] += KVEDGE_DECODER_LEARN_WEIGHT * fmin(fmax(o->r[i] - l->log_f[i], -step), step);
        l->samples[i]++;
    }
}

static void s_read_speed(void *arg, kvedge_decoder_impl_learn_t *l)
{
    kvedge_decoder_speed_t *out = arg;
    out->compute = exp(l->log_f[S_KIND_COMPUTE]);
    out->recompute = exp(l->log_f[S_KIND_RECOMPUTE]);
    out->compute_samples = l->samples[S_KIND_COMPUTE];
    out->recompute_samples = l->samples[S_KIND_RECOMPUTE];
}

static void s_clear(void *arg, kvedge_decoder_impl_learn_t *l)
{
    (void)arg;
    memset(l, 0, sizeof *l);
}

/* The calibrated (prior) estimate in seconds of each kind; recompute 0 when ctx_len is 0. */
static int s_prior(const kvedge_decoder_t *self, uint32_t ctx_len, uint32_t prompt_len,
                   double prior[S_KINDS])
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(self);
    if (!c || c->layers == 0 || prompt_len == 0)
        return KVEDGE_EINVAL;
    kvedge_decoder_impl_cost_t k;
    int rc = kvedge_decoder_impl_costs(self, s_measure, &k);
    if (rc != KVEDGE_OK)
        return rc;
    prior[S_KIND_COMPUTE] = k.fixed_s + s_dense_flops(c, prompt_len) / k.dense_rate +
                            k.score_s * s_scores(c, prompt_len, ctx_len);
    prior[S_KIND_RECOMPUTE] = ctx_len ? k.fixed_s + s_dense_flops(c, ctx_len) / k.dense_rate +
                                            k.score_s * s_scores(c, ctx_len, 0)
                                      : 0;
    return KVEDGE_OK;
}

int kvedge_decoder_estimate(const kvedge_decoder_t *self, uint32_t ctx_len, uint32_t prompt_len,
                            float *compute_us, float *recompute_us)
{
    double t[S_KINDS];
    int rc = s_prior(self, ctx_len, prompt_len, t);
    if (rc != KVEDGE_OK)
        return rc;
    s_factors_t f;
    kvedge_decoder_impl_learned(self, s_read_factors, &f);
    for (int i = 0; i < S_KINDS; i++)
        t[i] *= f.f[i];
    if (compute_us)
        *compute_us = (float)(t[S_KIND_COMPUTE] * 1e6);
    if (recompute_us)
        *recompute_us = (float)(t[S_KIND_RECOMPUTE] * 1e6);
    return KVEDGE_OK;
}

int kvedge_decoder_observe(const kvedge_decoder_t *self, uint32_t ctx_len, uint32_t prompt_len,
                           double compute_us, double recompute_us)
{
    const double obs[S_KINDS] = {compute_us, recompute_us};
    bool use[S_KINDS];
    for (int i = 0; i < S_KINDS; i++) {
        if (!isfinite(obs[i]))
            return KVEDGE_EINVAL;
        use[i] = obs[i] >= 0;
    }
    use[S_KIND_RECOMPUTE] = use[S_KIND_RECOMPUTE] && ctx_len > 0;
    if (!use[S_KIND_COMPUTE] && !use[S_KIND_RECOMPUTE])
        return KVEDGE_EINVAL;
    double prior[S_KINDS];
    int rc = s_prior(self, ctx_len, prompt_len, prior);
    if (rc != KVEDGE_OK)
        return rc;
    const double lo = log(KVEDGE_DECODER_LEARN_MIN), hi = log(KVEDGE_DECODER_LEARN_MAX);
    double r[S_KINDS] = {0, 0};
    for (int i = 0; i < S_KINDS; i++) {
        use[i] = use[i] && prior[i] > 0;
        /* 0 observed gives log 0 = -inf, which the clamp takes to the floor. */
        if (use[i])
            r[i] = fmin(fmax(log(obs[i] * 1e-6 / prior[i]), lo), hi);
    }
    const s_observe_t o = {r, use};
    kvedge_decoder_impl_learned(self, s_fold, (void *)&o);
    return KVEDGE_OK;
}

int kvedge_decoder_speed(const kvedge_decoder_t *self, kvedge_decoder_speed_t *out)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(self);
    if (!out || !c || c->layers == 0)
        return KVEDGE_EINVAL;
    kvedge_decoder_impl_learned(self, s_read_speed, out);
    return KVEDGE_OK;
}

void kvedge_decoder_forget(const kvedge_decoder_t *self)
{
    if (self)
        kvedge_decoder_impl_learned(self, s_clear, NULL);
}

/* ---------------------------------------------------------------- sharing the cores */

static pthread_mutex_t s_share_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned s_share_count; /* shares held, process-wide */
static int s_share_base;       /* OpenBLAS's threads when the first share was taken */

int kvedge_decoder_share_cores(bool *held, bool share)
{
    pthread_mutex_lock(&s_share_mu);
    if (held && share && !*held) {
        if (s_share_count++ == 0) {
            s_share_base = openblas_get_num_threads();
            const int fewer = s_share_base - KVEDGE_DECODER_FETCH_THREADS;
            openblas_set_num_threads(fewer > 1 ? fewer : 1);
        }
        *held = true;
    } else if (held && !share && *held) {
        if (--s_share_count == 0)
            openblas_set_num_threads(s_share_base);
        *held = false;
    }
    const int now = openblas_get_num_threads();
    pthread_mutex_unlock(&s_share_mu);
    return now;
}
