/* Built-in model shapes and their on-disk record. */
#include "access/codec/model.h"

#include <string.h>

#include "access/codec/error.h"

/* KV shapes as published in each model's configuration (num_hidden_layers,
 * num_key_value_heads, hidden_size / num_attention_heads, or head_dim where the config gives
 * it; dtype from torch_dtype). The edge models, from their config.json on Hugging Face:
 * meta-llama/Llama-3.2-1B (16 layers, 8 KV of 32 heads, head_dim 64, bfloat16),
 * meta-llama/Llama-3.2-3B (28, 8 of 24, 3072 / 24 = 128, bfloat16), Qwen/Qwen2.5-0.5B (24, 2 of
 * 14, 896 / 14 = 64, bfloat16), Qwen/Qwen2.5-1.5B (28, 2 of 12, 1536 / 12 = 128, bfloat16),
 * HuggingFaceTB/SmolLM2-360M (32, 5 of 15, 960 / 15 = 64, bfloat16). */
static const kvedge_model_t s_builtins[] = {
    {"opt-125m", 12, 12, 64, KVEDGE_DTYPE_FP16},    {"opt-350m", 24, 16, 64, KVEDGE_DTYPE_FP16},
    {"opt-1.3b", 24, 32, 64, KVEDGE_DTYPE_FP16},    {"opt-2.7b", 32, 32, 80, KVEDGE_DTYPE_FP16},
    {"opt-6.7b", 32, 32, 128, KVEDGE_DTYPE_FP16},   {"opt-13b", 40, 40, 128, KVEDGE_DTYPE_FP16},
    {"llama-2-7b", 32, 32, 128, KVEDGE_DTYPE_FP16}, {"llama-2-13b", 40, 40, 128, KVEDGE_DTYPE_FP16},
    {"llama-3-8b", 32, 8, 128, KVEDGE_DTYPE_BF16},  {"mistral-7b", 32, 8, 128, KVEDGE_DTYPE_BF16},
    {"qwen2-0.5b", 24, 2, 64, KVEDGE_DTYPE_BF16},   {"qwen2-7b", 28, 4, 128, KVEDGE_DTYPE_BF16},
    {"llama-3.2-1b", 16, 8, 64, KVEDGE_DTYPE_BF16}, {"llama-3.2-3b", 28, 8, 128, KVEDGE_DTYPE_BF16},
    {"qwen2.5-0.5b", 24, 2, 64, KVEDGE_DTYPE_BF16}, {"qwen2.5-1.5b", 28, 2, 128, KVEDGE_DTYPE_BF16},
    {"smollm2-360m", 32, 5, 64, KVEDGE_DTYPE_BF16},
};

const kvedge_model_t *kvedge_model_builtins(size_t *n)
{
    *n = sizeof s_builtins / sizeof s_builtins[0];
    return s_builtins;
}

int kvedge_model_builtin(const char *id, kvedge_model_t *out)
{
    size_t n;
    const kvedge_model_t *t = kvedge_model_builtins(&n);
    for (size_t i = 0; id && i < n; i++) {
        if (strcmp(t[i].id, id) == 0) {
            *out = t[i];
            return KVEDGE_OK;
        }
    }
    return KVEDGE_ENOMODEL;
}

uint32_t kvedge_model_id_rope(const char *id)
{
    size_t len = id ? strnlen(id, KVEDGE_MODEL_ID_MAX_BYTES + 1) : 0;
    const size_t sl = KVEDGE_MODEL_ROPE_SUFFIX_BYTES;
    if (len <= sl || len > KVEDGE_MODEL_ID_MAX_BYTES || strncmp(id + len - sl, "@rope-", 6) != 0)
        return 0;
    uint32_t f = 0;
    for (size_t i = len - 8; i < len; i++) {
        char ch = id[i];
        int v = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (v < 0)
            return 0;
        f = f << 4 | (uint32_t)v;
    }
    return f;
}

int kvedge_model_builtin_rope(const char *id, kvedge_model_t *out)
{
    if (!out || kvedge_model_id_rope(id) == 0)
        return KVEDGE_ENOMODEL;
    char base[KVEDGE_MODEL_ID_MAX_BYTES + 1];
    size_t blen = strlen(id) - KVEDGE_MODEL_ROPE_SUFFIX_BYTES;
    memcpy(base, id, blen);
    base[blen] = '\0';
    kvedge_model_t m;
    if (kvedge_model_builtin(base, &m) != KVEDGE_OK)
        return KVEDGE_ENOMODEL;
    memcpy(m.id, id, strlen(id) + 1);
    m.dtype = KVEDGE_DTYPE_FP16;
    *out = m;
    return KVEDGE_OK;
}

int kvedge_model_check(const kvedge_model_t *m)
{
    if (!m || m->id[0] == '\0' || m->layers == 0 || m->kv_heads == 0 || m->head_dim == 0 ||
        kvedge_dtype_size(m->dtype) == 0)
        return KVEDGE_EINVAL;
    if (strnlen(m->id, sizeof m->id) > KVEDGE_MODEL_ID_MAX_BYTES)
        return KVEDGE_ETOOBIG;
    if (m->layers > KVEDGE_MODEL_MAX_LAYERS || m->kv_heads > KVEDGE_MODEL_MAX_HEADS ||
        m->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM)
        return KVEDGE_ETOOBIG;
    return KVEDGE_OK;
}

uint64_t kvedge_model_fp16_bytes(const kvedge_model_t *m, uint64_t tokens)
{
    return 2ull * 2ull * m->layers * m->kv_heads * m->head_dim * tokens;
}

void kvedge_model_pack(const kvedge_model_t *m, uint8_t out[KVEDGE_MODEL_RECORD_BYTES])
{
    memset(out, 0, KVEDGE_MODEL_RECORD_BYTES);
    out[0] = 1; /* record version */
    out[1] = (uint8_t)m->dtype;
    out[2] = (uint8_t)(m->layers >> 8);
    out[3] = (uint8_t)m->layers;
    out[4] = (uint8_t)(m->kv_heads >> 8);
    out[5] = (uint8_t)m->kv_heads;
    out[6] = (uint8_t)(m->head_dim >> 8);
    out[7] = (uint8_t)m->head_dim;
}

int kvedge_model_unpack(const char *id, const uint8_t *buf, size_t len, kvedge_model_t *out)
{
    if (!id || !buf || !out || len != KVEDGE_MODEL_RECORD_BYTES || buf[0] != 1 ||
        strlen(id) > KVEDGE_MODEL_ID_MAX_BYTES)
        return KVEDGE_ECORRUPT;
    memset(out, 0, sizeof *out);
    strcpy(out->id, id);
    out->dtype = (kvedge_dtype_t)buf[1];
    out->layers = (uint16_t)(buf[2] << 8 | buf[3]);
    out->kv_heads = (uint16_t)(buf[4] << 8 | buf[5]);
    out->head_dim = (uint16_t)(buf[6] << 8 | buf[7]);
    return kvedge_model_check(out) == KVEDGE_OK ? KVEDGE_OK : KVEDGE_ECORRUPT;
}
