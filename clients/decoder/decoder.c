/* The reference decoder: fp32 on the CPU with OpenBLAS, Hugging Face semantics for OPT
 * (pre-LayerNorm, learned positions with an offset of 2, ReLU FFN, tied output head) and the
 * Llama family (rotary positions, grouped-query attention, RMSNorm, SwiGLU), one forward whose
 * few differences an architecture table names. */
#include "clients/decoder/decoder.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clients/decoder/decoder_gpu.h"
#include "clients/decoder/decoder_impl.h"
#include "clients/decoder/safetensors.h"
#include "gpu/attn.h"
#include "access/codec/bigmem.h"
#include "access/codec/error.h"

/* nn.LayerNorm's default, which every OPT checkpoint uses. */
#define S_LAYER_NORM_EPS 1e-5
#define S_ERROR_BYTES    256
/* Longest tensor name we build: prefix, layer index and the longest suffix. */
#define S_NAME_BYTES 160

/* Largest config.json and model.safetensors.index.json read. */
#define S_JSON_MAX_BYTES (64u << 20)
/* Most shards an index may name. */
#define S_MAX_SHARDS 4096

/* What differs between the architectures, as data: the forward branches only on these. */
typedef struct {
    const char *model_type; /* Hugging Face's config.json model_type */
    bool rotary;            /* rotary positions (else OPT's learned ones, offset 2) */
    bool rms_norm;          /* RMSNorm without bias (else LayerNorm with bias) */
    bool swiglu;            /* down(silu(gate(x)) * up(x)) (else fc2(relu(fc1(x))) with biases) */
    bool qkv_bias;          /* q/k/v projections carry biases */
    bool o_bias;            /* the output projection carries a bias */
} s_arch_t;

static const s_arch_t s_archs[] = {
    {"opt", false, false, false, true, true},
    {"llama", true, true, true, false, false},
    {"mistral", true, true, true, false, false},
    {"qwen2", true, true, true, true, false},
};

typedef struct {
    const float *ln1_w, *ln1_b; /* self_attn_layer_norm / input_layernorm (no bias: RMSNorm) */
    const float *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo; /* biases NULL where the arch has none */
    const float *ln2_w, *ln2_b; /* final_layer_norm / post_attention_layernorm, before the MLP */
    const float *fc1_w, *fc1_b, *fc2_w, *fc2_b; /* OPT; SwiGLU: fc1 gate, fc2 down */
    const float *up_w;                          /* SwiGLU's up_proj */
} s_layer_t;

struct _kvedge_decoder_t {
    kvedge_decoder_config_t cfg; /* shape, zero until loaded */
    const s_arch_t *arch;        /* the architecture, NULL until loaded */
    uint32_t kv_heads;           /* K/V heads: cfg.heads, or fewer (grouped-query attention) */
    double norm_eps;             /* LayerNorm's 1e-5, or config.json's rms_norm_eps */
    float *inv_freq;             /* rotary: [head_dim / 2] frequencies, scaling applied; owned */
    kvedge_decoder_rope_t rope;  /* rotary settings (rotary false for OPT) */
    const float *embed;          /* embed_tokens [vocab][hidden] */
    const float *pos;            /* embed_positions [max_positions + 2][hidden]; NULL if rotary */
    const float *head;           /* output head [vocab][hidden]: embed, or lm_head if stored */
    const float *lnf_w, *lnf_b;  /* the decoder's final_layer_norm */
    s_layer_t *layer;            /* [layers] pointers into weights */
    float **weights;             /* every fp32 weight array, owned */
    size_t n_weights;            /* entries used in weights */
    size_t cap_weights;          /* entries allocated in weights */
    uint64_t weight_bytes;       /* bytes of the fp32 arrays in weights */
    char err[S_ERROR_BYTES];     /* detail of the last load failure */
    /* The one piece of state that changes after load: the costs kvedge_decoder_estimate
     * measures once, guarded by cost_lock so that concurrent callers measure once. */
    pthread_mutex_t cost_lock;
    kvedge_decoder_impl_cost_t cost; /* valid when cost_known */
    bool cost_known;
    /* The other: what kvedge_decoder_observe learned (decoder_model.c), under learn_lock. */
    pthread_mutex_t learn_lock;
    kvedge_decoder_impl_learn_t learn;
};

/* Scratch of one forward pass, grown on demand and reused across layers and steps. */
typedef struct {
    float *buf;         /* one allocation holding everything below */
    size_t cap;         /* floats in buf */
    float *ln;          /* [n][hidden] normalized input */
    float *q;           /* [n][max(hidden, heads * head_dim)] queries, then projection outputs */
    float *k, *v;       /* [n][kv_heads * head_dim] new keys and values, token-major */
    float *attn;        /* [n][heads * head_dim] merged attention output */
    float *ffn;         /* [n][ffn] (SwiGLU: gate, then up after it, [2][n][ffn]) */
    float *qh;          /* [heads][n][head_dim] scaled queries, as gpu/attn.h takes them */
    float *oa, *ob;     /* [heads][n][head_dim] partial outputs over external and local K/V */
    float *lsea, *lseb; /* [heads][n] their log-sum-exps */
} s_work_t;

struct _kvedge_decoder_session_t {
    const kvedge_decoder_t *model; /* not owned */
    s_work_t work;                 /* forward scratch */
    bool ready;                    /* a begin succeeded and nothing failed since */
    uint32_t ctx_len;              /* context tokens */
    int32_t *ctx_tokens;           /* [ctx_len], for recomputing a MISS layer */
    float *ctx_k, *ctx_v;          /* [layers][kv_heads][ctx_len][head_dim] context K/V */
    float *ctx_h;                  /* [ctx_len][hidden] context hidden at ctx_layer's input */
    uint32_t ctx_layer;            /* layers the context has been run through */
    float *ctx_tmp_k, *ctx_tmp_v;  /* [kv_heads][ctx_len][head_dim] a fetched layer's rerun */
    uint32_t loc_len;              /* tokens in the local cache */
    uint32_t loc_cap;              /* prompt plus max_new */
    float *loc_k, *loc_v;          /* [layers][kv_heads][loc_cap][head_dim] local K/V */
    float *x;                      /* [loc_cap][hidden] hidden states of the tokens in flight */
    float *logits;                 /* [vocab] logits of the last position */
    bool reserved;                 /* buffers lent out by reserve: only reserve/destroy free them */
    uint32_t res_ctx, res_loc;     /* the reserved context length and local capacity */
    uint64_t kv_bytes;             /* K/V and context state held by the last decode, at its peak */
};

/* ---------------------------------------------------------------------------------------- */
/* Loading                                                                                   */

__attribute__((format(printf, 3, 4))) static int s_fail(kvedge_decoder_t *self, int rc,
                                                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(self->err, sizeof self->err, fmt, ap);
    va_end(ap);
    return rc;
}

kvedge_decoder_t *kvedge_decoder_new(void)
{
    kvedge_decoder_t *self = calloc(1, sizeof(kvedge_decoder_t));
    if (self && pthread_mutex_init(&self->cost_lock, NULL) != 0) {
        free(self);
        self = NULL;
    } else if (self && pthread_mutex_init(&self->learn_lock, NULL) != 0) {
        pthread_mutex_destroy(&self->cost_lock);
        free(self);
        self = NULL;
    }
    return self;
}

/* Frees the weights and returns the model to its state before load, keeping the error text. */
static void s_unload(kvedge_decoder_t *self)
{
    for (size_t i = self->n_weights; i > 0; i--)
        free(self->weights[i - 1]);
    free(self->weights);
    free(self->layer);
    free(self->inv_freq);
    self->inv_freq = NULL;
    memset(&self->rope, 0, sizeof self->rope);
    self->arch = NULL;
    self->kv_heads = 0;
    memset(&self->cfg, 0, sizeof self->cfg);
    self->embed = self->pos = self->head = self->lnf_w = self->lnf_b = NULL;
    self->layer = NULL;
    self->weights = NULL;
    self->n_weights = self->cap_weights = 0;
    self->weight_bytes = 0;
    memset(&self->cost, 0, sizeof self->cost);
    self->cost_known = false;
    memset(&self->learn, 0, sizeof self->learn);
}

void kvedge_decoder_destroy(kvedge_decoder_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    s_unload(*self_p);
    pthread_mutex_destroy(&(*self_p)->cost_lock);
    pthread_mutex_destroy(&(*self_p)->learn_lock);
    free(*self_p);
    *self_p = NULL;
}

const char *kvedge_decoder_error(const kvedge_decoder_t *self)
{
    return self ? self->err : "";
}

const kvedge_decoder_config_t *kvedge_decoder_config(const kvedge_decoder_t *self)
{
    return self ? &self->cfg : NULL;
}

size_t kvedge_decoder_kv_floats(const kvedge_decoder_t *self, uint32_t tokens)
{
    return self ? (size_t)self->kv_heads * tokens * self->cfg.head_dim : 0;
}

int kvedge_decoder_rope(const kvedge_decoder_t *self, kvedge_decoder_rope_t *out)
{
    if (!self || !out)
        return KVEDGE_EINVAL;
    *out = self->rope;
    return KVEDGE_OK;
}

uint32_t kvedge_decoder_kv_heads(const kvedge_decoder_t *self)
{
    return self ? self->kv_heads : 0;
}

uint32_t kvedge_decoder_rope_fingerprint(const kvedge_decoder_t *self)
{
    if (!self || !self->arch || !self->arch->rotary || !self->inv_freq)
        return 0;
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < self->cfg.head_dim / 2; i++) {
        uint32_t bits;
        memcpy(&bits, &self->inv_freq[i], sizeof bits);
        for (int b = 0; b < 4; b++) {
            h ^= (bits >> (8 * b)) & 0xFFu;
            h *= 16777619u;
        }
    }
    return h ? h : 1;
}

/* The safetensors files of a model: one, or the shards an index names. */
typedef struct {
    kvedge_safetensors_t **st; /* open readers, [n] */
    char **file;               /* their file names as the index gives them, [n] */
    size_t n;
} s_tset_t;

static void s_tset_free(s_tset_t *ts)
{
    for (size_t i = ts->n; i > 0; i--) {
        kvedge_safetensors_destroy(&ts->st[i - 1]);
        free(ts->file[i - 1]);
    }
    free(ts->st);
    free(ts->file);
    memset(ts, 0, sizeof *ts);
}

/* The tensor called name in any of the files, or NULL. */
static const kvedge_safetensors_tensor_t *s_tfind(const s_tset_t *ts, const char *name)
{
    for (size_t i = 0; i < ts->n; i++) {
        const kvedge_safetensors_tensor_t *t = kvedge_safetensors_find(ts->st[i], name);
        if (t)
            return t;
    }
    return NULL;
}

/* Where the file keeps the decoder's tensors: "model.decoder." or "decoder.". */
typedef struct {
    const s_tset_t *ts;
    const char *prefix;
} s_names_t;

static const kvedge_safetensors_tensor_t *s_find(const s_names_t *nm, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static const kvedge_safetensors_tensor_t *s_find(const s_names_t *nm, const char *fmt, ...)
{
    char suffix[S_NAME_BYTES], name[S_NAME_BYTES + 16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(suffix, sizeof suffix, fmt, ap);
    va_end(ap);
    snprintf(name, sizeof name, "%s%s", nm->prefix, suffix);
    return s_tfind(nm->ts, name);
}

/* Checks tensor t against the expected shape (d1 == 0: one dimension) and converts it to an
 * owned fp32 array. */
static int s_take(kvedge_decoder_t *self, const kvedge_safetensors_tensor_t *t, const char *what,
                  uint64_t d0, uint64_t d1, const float **out)
{
    if (!t)
        return s_fail(self, KVEDGE_ENOTFOUND, "tensor %s is missing", what);
    uint32_t ndim = d1 ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != d0 || (d1 && t->shape[1] != d1))
        return s_fail(self, KVEDGE_ESHAPE, "tensor %s: shape [%llu%s%llu] does not fit the config",
                      t->name, (unsigned long long)(t->ndim ? t->shape[0] : 0),
                      t->ndim > 1 ? ", " : "", (unsigned long long)(t->ndim > 1 ? t->shape[1] : 0));
    if (self->n_weights == self->cap_weights) {
        size_t cap = self->cap_weights ? self->cap_weights * 2 : 32;
        float **w = realloc(self->weights, cap * sizeof *w);
        if (!w)
            return s_fail(self, KVEDGE_ENOMEM, "out of memory");
        self->weights = w;
        self->cap_weights = cap;
    }
    float *f = malloc((size_t)t->numel * sizeof(float));
    if (!f)
        return s_fail(self, KVEDGE_ENOMEM, "out of memory for tensor %s", t->name);
    kvedge_safetensors_to_f32(t, f, (size_t)t->numel);
    self->weights[self->n_weights++] = f;
    self->weight_bytes += t->numel * sizeof(float);
    *out = f;
    return KVEDGE_OK;
}

/* Reads a positive count from __metadata__; 0 when absent, -1 when malformed. */
static long s_meta_count(const kvedge_safetensors_t *st, const char *key)
{
    const char *s = st ? kvedge_safetensors_metadata(st, key) : NULL;
    if (!s)
        return 0;
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && *end == '\0' && v > 0 && v <= 65536) ? v : -1;
}

/* Derives the config from the tensors (and heads from the caller or metadata). */
static int s_config(kvedge_decoder_t *self, const s_names_t *nm, uint32_t heads)
{
    kvedge_decoder_config_t *c = &self->cfg;
    const kvedge_safetensors_tensor_t *emb = s_find(nm, "embed_tokens.weight");
    const kvedge_safetensors_tensor_t *pos = s_find(nm, "embed_positions.weight");
    if (!emb || !pos)
        return s_fail(self, KVEDGE_ENOTFOUND, "tensor %sembed_%s.weight is missing", nm->prefix,
                      emb ? "positions" : "tokens");
    if (emb->ndim != 2 || emb->shape[0] == 0 || emb->shape[1] == 0 || emb->shape[0] > INT32_MAX ||
        emb->shape[1] > UINT32_MAX)
        return s_fail(self, KVEDGE_ESHAPE, "tensor %s is not [vocab][hidden]", emb->name);
    c->vocab = (uint32_t)emb->shape[0];
    c->hidden = (uint32_t)emb->shape[1];
    if (pos->ndim != 2 || pos->shape[0] <= KVEDGE_DECODER_POSITION_OFFSET ||
        pos->shape[0] > UINT32_MAX)
        return s_fail(self, KVEDGE_ESHAPE, "tensor %s is not [max_positions + 2][hidden]",
                      pos->name);
    c->max_positions = (uint32_t)(pos->shape[0] - KVEDGE_DECODER_POSITION_OFFSET);
    if (s_find(nm, "project_in.weight") || s_find(nm, "project_out.weight"))
        return s_fail(self, KVEDGE_EINVAL, "OPT with project_in/out (OPT-350m) is not supported");
    const kvedge_safetensors_t *st0 = nm->ts->n ? nm->ts->st[0] : NULL;
    const char *pre = st0 ? kvedge_safetensors_metadata(st0, "do_layer_norm_before") : NULL;
    const char *act = st0 ? kvedge_safetensors_metadata(st0, "activation_function") : NULL;
    if ((pre && strcmp(pre, "true") != 0 && strcmp(pre, "True") != 0 && strcmp(pre, "1") != 0) ||
        (act && strcmp(act, "relu") != 0))
        return s_fail(self, KVEDGE_EINVAL, "only pre-LayerNorm OPT with ReLU is supported");

    while (c->layers < 100000 && s_find(nm, "layers.%u.self_attn.q_proj.weight", c->layers))
        c->layers++;
    if (c->layers == 0)
        return s_fail(self, KVEDGE_ENOTFOUND,
                      "tensor %slayers.0.self_attn.q_proj.weight is missing", nm->prefix);
    const kvedge_safetensors_tensor_t *fc1 = s_find(nm, "layers.0.fc1.weight");
    if (!fc1)
        return s_fail(self, KVEDGE_ENOTFOUND, "tensor %slayers.0.fc1.weight is missing",
                      nm->prefix);
    if (fc1->ndim != 2 || fc1->shape[0] == 0 || fc1->shape[0] > UINT32_MAX)
        return s_fail(self, KVEDGE_ESHAPE, "tensor %s is not [ffn][hidden]", fc1->name);
    c->ffn = (uint32_t)fc1->shape[0];

    long mh = s_meta_count(st0, "num_attention_heads");
    if (mh < 0)
        return s_fail(self, KVEDGE_ESHAPE, "__metadata__ num_attention_heads is not a count");
    if (heads)
        c->heads = heads;
    else if (mh)
        c->heads = (uint32_t)mh;
    else
        c->heads = c->hidden / KVEDGE_DECODER_HEAD_DIM_DEFAULT;
    if (c->heads == 0 || c->hidden % c->heads != 0)
        return s_fail(self, KVEDGE_ESHAPE, "%u heads do not divide hidden size %u", c->heads,
                      c->hidden);
    c->head_dim = c->hidden / c->heads;
    self->kv_heads = c->heads;
    c->kv_heads = c->heads;
    return KVEDGE_OK;
}

/* ---- config.json ---- */

/* A field that is present and not null. */
static const cJSON *s_jfield(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return j && !cJSON_IsNull(j) ? j : NULL;
}

/* Reads an integer field in [lo, hi] into *out; absent: *out stays (required: an error). */
static int s_jcount(const cJSON *o, const char *key, bool required, uint32_t lo, uint32_t hi,
                    uint32_t *out, char *err, size_t err_bytes)
{
    const cJSON *j = s_jfield(o, key);
    if (!j) {
        if (!required)
            return KVEDGE_OK;
        snprintf(err, err_bytes, "%s is missing", key);
        return KVEDGE_ECORRUPT;
    }
    const double v = cJSON_IsNumber(j) ? j->valuedouble : -1;
    if (!cJSON_IsNumber(j) || v != floor(v) || v < lo || v > hi) {
        snprintf(err, err_bytes, "%s is not an integer in [%u, %u]", key, lo, hi);
        return KVEDGE_ECORRUPT;
    }
    *out = (uint32_t)v;
    return KVEDGE_OK;
}

/* Reads a number field in (lo, hi] into *out; absent: *out stays. */
static int s_jnum(const cJSON *o, const char *key, double lo, double hi, double *out, char *err,
                  size_t err_bytes)
{
    const cJSON *j = s_jfield(o, key);
    if (!j)
        return KVEDGE_OK;
    if (!cJSON_IsNumber(j) || !(j->valuedouble > lo && j->valuedouble <= hi)) {
        snprintf(err, err_bytes, "%s is not a number in (%g, %g]", key, lo, hi);
        return KVEDGE_ECORRUPT;
    }
    *out = j->valuedouble;
    return KVEDGE_OK;
}

/* A field's value as text for a refusal ("true", "0.5", "\"x\""). */
static void s_jtext(const cJSON *j, char *buf, size_t len)
{
    char *t = cJSON_PrintUnformatted(j);
    snprintf(buf, len, "%.60s", t ? t : "?");
    cJSON_free(t);
}

/* The features the decoder does not implement, refused by name when config.json uses them. */
static int s_config_refuse(const cJSON *root, const char *model_type, uint32_t max_positions,
                           char *err, size_t err_bytes)
{
    char val[64];
    /* Present and non-null means in use: MLA, soft-capping, MoE. */
    static const char *const used[] = {
        "kv_lora_rank", "q_lora_rank",       "attn_logit_softcapping", "final_logit_softcapping",
        "num_experts",  "num_local_experts", "n_routed_experts"};
    for (size_t i = 0; i < sizeof used / sizeof used[0]; i++) {
        const cJSON *j = s_jfield(root, used[i]);
        if (j && !(cJSON_IsNumber(j) && j->valuedouble == 0) && !cJSON_IsFalse(j)) {
            s_jtext(j, val, sizeof val);
            snprintf(err, err_bytes, "%s %s is not supported", used[i], val);
            return KVEDGE_EINVAL;
        }
    }
    const cJSON *j = s_jfield(root, "partial_rotary_factor");
    if (j && !(cJSON_IsNumber(j) && j->valuedouble == 1.0)) {
        s_jtext(j, val, sizeof val);
        snprintf(err, err_bytes, "partial_rotary_factor %s is not supported (only 1)", val);
        return KVEDGE_EINVAL;
    }
    /* Sliding windows: Qwen2 says whether with use_sliding_window; Mistral by giving one. A
     * window as long as the context changes nothing. */
    const cJSON *use = s_jfield(root, "use_sliding_window");
    const cJSON *win = s_jfield(root, "sliding_window");
    if (use && cJSON_IsTrue(use)) {
        snprintf(err, err_bytes, "use_sliding_window true is not supported");
        return KVEDGE_EINVAL;
    }
    if (!use && win && !(cJSON_IsNumber(win) && win->valuedouble >= max_positions)) {
        s_jtext(win, val, sizeof val);
        snprintf(err, err_bytes, "sliding_window %s is not supported (%s without one)", val,
                 model_type);
        return KVEDGE_EINVAL;
    }
    j = s_jfield(root, "mlp_bias");
    if (j && !cJSON_IsFalse(j)) {
        s_jtext(j, val, sizeof val);
        snprintf(err, err_bytes, "mlp_bias %s is not supported", val);
        return KVEDGE_EINVAL;
    }
    return KVEDGE_OK;
}

/* rope_scaling: null, "default", or Llama 3's. */
static int s_config_rope(const cJSON *root, kvedge_decoder_impl_hf_config_t *out, char *err,
                         size_t err_bytes)
{
    const cJSON *rs = s_jfield(root, "rope_scaling");
    if (!rs)
        return KVEDGE_OK;
    if (!cJSON_IsObject(rs)) {
        snprintf(err, err_bytes, "rope_scaling is not an object");
        return KVEDGE_ECORRUPT;
    }
    const char *type = cJSON_GetStringValue(s_jfield(rs, "rope_type"));
    if (!type)
        type = cJSON_GetStringValue(s_jfield(rs, "type"));
    if (type && strcmp(type, "default") == 0)
        return KVEDGE_OK;
    if (!type || strcmp(type, "llama3") != 0) {
        snprintf(err, err_bytes, "rope_scaling.rope_type \"%.40s\" is not supported (llama3)",
                 type ? type : "(none)");
        return KVEDGE_EINVAL;
    }
    out->rope_llama3 = true;
    out->rope_factor = out->rope_low = out->rope_high = out->rope_orig_max = 0;
    int rc = s_jnum(rs, "factor", 0, 1e6, &out->rope_factor, err, err_bytes);
    if (rc == KVEDGE_OK)
        rc = s_jnum(rs, "low_freq_factor", 0, 1e6, &out->rope_low, err, err_bytes);
    if (rc == KVEDGE_OK)
        rc = s_jnum(rs, "high_freq_factor", 0, 1e6, &out->rope_high, err, err_bytes);
    if (rc == KVEDGE_OK)
        rc = s_jnum(rs, "original_max_position_embeddings", 0, 1e9, &out->rope_orig_max, err,
                    err_bytes);
    if (rc == KVEDGE_OK && !(out->rope_factor > 0 && out->rope_low > 0 &&
                             out->rope_high > out->rope_low && out->rope_orig_max > 0)) {
        snprintf(err, err_bytes,
                 "rope_scaling (llama3) needs factor, low_freq_factor < "
                 "high_freq_factor and original_max_position_embeddings");
        rc = KVEDGE_ECORRUPT;
    }
    return rc;
}

int kvedge_decoder_impl_parse_config(const char *json, size_t len,
                                     kvedge_decoder_impl_hf_config_t *out, char *err,
                                     size_t err_bytes)
{
    if (!json || !out || !err || err_bytes == 0)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    err[0] = '\0';
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        snprintf(err, err_bytes, "not a JSON object");
        return KVEDGE_ECORRUPT;
    }
    int rc = KVEDGE_OK;
    const char *mt = cJSON_GetStringValue(s_jfield(root, "model_type"));
    const s_arch_t *arch = NULL;
    for (size_t i = 0; mt && i < sizeof s_archs / sizeof s_archs[0]; i++)
        if (strcmp(s_archs[i].model_type, mt) == 0)
            arch = &s_archs[i];
    if (!mt) {
        snprintf(err, err_bytes, "model_type is missing");
        rc = KVEDGE_ECORRUPT;
    } else if (!arch) {
        snprintf(err, err_bytes,
                 "model_type \"%.40s\" is not supported (opt, llama, mistral, qwen2)", mt);
        rc = KVEDGE_EINVAL;
    }
    kvedge_decoder_config_t *c = &out->cfg;
    const uint32_t big = 1u << 24;
    if (rc == KVEDGE_OK) {
        snprintf(out->model_type, sizeof out->model_type, "%s", mt);
        rc = s_jcount(root, "num_attention_heads", true, 1, 1024, &c->heads, err, err_bytes);
    }
    if (rc == KVEDGE_OK)
        rc = s_jcount(root, "num_hidden_layers", !arch->rotary ? false : true, 1, 1024, &c->layers,
                      err, err_bytes);
    if (rc == KVEDGE_OK && !arch->rotary) { /* OPT: the tensors give the rest */
        const char *act = cJSON_GetStringValue(s_jfield(root, "activation_function"));
        const cJSON *pre = s_jfield(root, "do_layer_norm_before");
        uint32_t proj = 0, hidden = 0;
        rc = s_jcount(root, "word_embed_proj_dim", false, 1, big, &proj, err, err_bytes);
        if (rc == KVEDGE_OK)
            rc = s_jcount(root, "hidden_size", false, 1, big, &hidden, err, err_bytes);
        if (rc == KVEDGE_OK && act && strcmp(act, "relu") != 0) {
            snprintf(err, err_bytes, "activation_function \"%.40s\" is not supported (relu)", act);
            rc = KVEDGE_EINVAL;
        } else if (rc == KVEDGE_OK && pre && !cJSON_IsTrue(pre)) {
            snprintf(err, err_bytes, "do_layer_norm_before false is not supported");
            rc = KVEDGE_EINVAL;
        } else if (rc == KVEDGE_OK && proj && hidden && proj != hidden) {
            snprintf(err, err_bytes, "word_embed_proj_dim %u is not supported (only hidden_size)",
                     proj);
            rc = KVEDGE_EINVAL;
        }
        cJSON_Delete(root);
        return rc;
    }
    if (rc == KVEDGE_OK)
        rc = s_jcount(root, "hidden_size", true, 1, big, &c->hidden, err, err_bytes);
    if (rc == KVEDGE_OK)
        rc = s_jcount(root, "intermediate_size", true, 1, big, &c->ffn, err, err_bytes);
    if (rc == KVEDGE_OK)
        rc = s_jcount(root, "vocab_size", true, 1, INT32_MAX, &c->vocab, err, err_bytes);
    c->max_positions = 2048;
    if (rc == KVEDGE_OK)
        rc = s_jcount(root, "max_position_embeddings", false, 1, big, &c->max_positions, err,
                      err_bytes);
    out->kv_heads = c->heads;
    if (rc == KVEDGE_OK)
        rc = s_jcount(root, "num_key_value_heads", false, 1, 1024, &out->kv_heads, err, err_bytes);
    if (rc == KVEDGE_OK && c->heads % out->kv_heads != 0) {
        snprintf(err, err_bytes, "num_key_value_heads %u does not divide num_attention_heads %u",
                 out->kv_heads, c->heads);
        rc = KVEDGE_ECORRUPT;
    }
    c->head_dim = c->heads ? c->hidden / c->heads : 0;
    if (rc == KVEDGE_OK)
        rc = s_jcount(root, "head_dim", false, 2, 4096, &c->head_dim, err, err_bytes);
    if (rc == KVEDGE_OK && (c->head_dim < 2 || c->head_dim % 2 != 0)) {
        snprintf(err, err_bytes, "head_dim %u is not even (hidden_size / num_attention_heads)",
                 c->head_dim);
        rc = KVEDGE_ECORRUPT;
    }
    out->norm_eps = 1e-6;
    out->rope_theta = 10000.0;
    if (rc == KVEDGE_OK)
        rc = s_jnum(root, "rms_norm_eps", 0, 1, &out->norm_eps, err, err_bytes);
    if (rc == KVEDGE_OK)
        rc = s_jnum(root, "rope_theta", 1, 1e12, &out->rope_theta, err, err_bytes);
    if (rc == KVEDGE_OK) {
        const char *act = cJSON_GetStringValue(s_jfield(root, "hidden_act"));
        if (act && strcmp(act, "silu") != 0) {
            snprintf(err, err_bytes, "hidden_act \"%.40s\" is not supported (silu)", act);
            rc = KVEDGE_EINVAL;
        }
    }
    if (rc == KVEDGE_OK)
        rc = s_config_refuse(root, mt, c->max_positions, err, err_bytes);
    if (rc == KVEDGE_OK)
        rc = s_config_rope(root, out, err, err_bytes);
    if (rc == KVEDGE_OK) {
        /* transformers' default: tied, unless the config says otherwise. */
        const cJSON *tie = s_jfield(root, "tie_word_embeddings");
        out->tie_embeddings = !tie || cJSON_IsTrue(tie);
        const cJSON *ab = s_jfield(root, "attention_bias");
        out->attention_bias = ab && cJSON_IsTrue(ab);
    }
    cJSON_Delete(root);
    return rc;
}

/* Loads OPT from the tensors of ts (heads: 0 for metadata's or the default). */
static int s_load_opt(kvedge_decoder_t *self, const s_tset_t *ts, uint32_t heads)
{
    self->arch = &s_archs[0];
    self->norm_eps = S_LAYER_NORM_EPS;
    /* HF checkpoints of OPTForCausalLM say "model.decoder.", those of OPTModel "decoder.". */
    s_names_t nm = {ts, "model.decoder."};
    if (!s_find(&nm, "embed_tokens.weight"))
        nm.prefix = "decoder.";

    int rc = s_config(self, &nm, heads);
    const kvedge_decoder_config_t c = self->cfg;
    if (rc == KVEDGE_OK) {
        self->layer = calloc(c.layers, sizeof *self->layer);
        rc = self->layer ? KVEDGE_OK : s_fail(self, KVEDGE_ENOMEM, "out of memory");
    }
#define S_TAKE(ptr, d0, d1, ...)                                                                   \
    do {                                                                                           \
        if (rc == KVEDGE_OK) {                                                                     \
            char what_[S_NAME_BYTES + 16];                                                         \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                            \
            const kvedge_safetensors_tensor_t *t_ = s_tfind(ts, what_);                            \
            rc = s_take(self, t_, what_, (d0), (d1), &(ptr));                                      \
        }                                                                                          \
    } while (0)
    S_TAKE(self->embed, c.vocab, c.hidden, "%sembed_tokens.weight", nm.prefix);
    S_TAKE(self->pos, (uint64_t)c.max_positions + KVEDGE_DECODER_POSITION_OFFSET, c.hidden,
           "%sembed_positions.weight", nm.prefix);
    S_TAKE(self->lnf_w, c.hidden, 0, "%sfinal_layer_norm.weight", nm.prefix);
    S_TAKE(self->lnf_b, c.hidden, 0, "%sfinal_layer_norm.bias", nm.prefix);
    for (uint32_t l = 0; rc == KVEDGE_OK && l < c.layers; l++) {
        s_layer_t *L = &self->layer[l];
        const char *p = nm.prefix;
        S_TAKE(L->ln1_w, c.hidden, 0, "%slayers.%u.self_attn_layer_norm.weight", p, l);
        S_TAKE(L->ln1_b, c.hidden, 0, "%slayers.%u.self_attn_layer_norm.bias", p, l);
        S_TAKE(L->wq, c.hidden, c.hidden, "%slayers.%u.self_attn.q_proj.weight", p, l);
        S_TAKE(L->bq, c.hidden, 0, "%slayers.%u.self_attn.q_proj.bias", p, l);
        S_TAKE(L->wk, c.hidden, c.hidden, "%slayers.%u.self_attn.k_proj.weight", p, l);
        S_TAKE(L->bk, c.hidden, 0, "%slayers.%u.self_attn.k_proj.bias", p, l);
        S_TAKE(L->wv, c.hidden, c.hidden, "%slayers.%u.self_attn.v_proj.weight", p, l);
        S_TAKE(L->bv, c.hidden, 0, "%slayers.%u.self_attn.v_proj.bias", p, l);
        S_TAKE(L->wo, c.hidden, c.hidden, "%slayers.%u.self_attn.out_proj.weight", p, l);
        S_TAKE(L->bo, c.hidden, 0, "%slayers.%u.self_attn.out_proj.bias", p, l);
        S_TAKE(L->ln2_w, c.hidden, 0, "%slayers.%u.final_layer_norm.weight", p, l);
        S_TAKE(L->ln2_b, c.hidden, 0, "%slayers.%u.final_layer_norm.bias", p, l);
        S_TAKE(L->fc1_w, c.ffn, c.hidden, "%slayers.%u.fc1.weight", p, l);
        S_TAKE(L->fc1_b, c.ffn, 0, "%slayers.%u.fc1.bias", p, l);
        S_TAKE(L->fc2_w, c.hidden, c.ffn, "%slayers.%u.fc2.weight", p, l);
        S_TAKE(L->fc2_b, c.hidden, 0, "%slayers.%u.fc2.bias", p, l);
    }
    /* The head is tied to embed_tokens; some checkpoints also store it as lm_head.weight. */
    self->head = self->embed;
    if (rc == KVEDGE_OK && s_tfind(ts, "lm_head.weight"))
        S_TAKE(self->head, c.vocab, c.hidden, "lm_head.weight");
#undef S_TAKE
    return rc;
}

/* Loads a Llama-family model (hf parsed from its config.json) from the tensors of ts. */
static int s_load_llama(kvedge_decoder_t *self, const s_tset_t *ts,
                        const kvedge_decoder_impl_hf_config_t *hf)
{
    for (size_t i = 0; i < sizeof s_archs / sizeof s_archs[0]; i++)
        if (strcmp(s_archs[i].model_type, hf->model_type) == 0)
            self->arch = &s_archs[i];
    if (!self->arch || !self->arch->rotary)
        return s_fail(self, KVEDGE_EINVAL, "config.json: model_type \"%s\" is not supported",
                      hf->model_type);
    self->cfg = hf->cfg;
    self->cfg.kv_heads = hf->kv_heads;
    self->kv_heads = hf->kv_heads;
    self->norm_eps = hf->norm_eps;
    const kvedge_decoder_config_t c = self->cfg;
    const uint64_t H = c.hidden, F = c.ffn, QD = (uint64_t)c.heads * c.head_dim,
                   KD = (uint64_t)hf->kv_heads * c.head_dim;
    const bool qkv_bias = self->arch->qkv_bias || hf->attention_bias;
    const bool o_bias = self->arch->o_bias || hf->attention_bias;
    const kvedge_safetensors_tensor_t *emb = s_tfind(ts, "model.embed_tokens.weight");
    if (emb && emb->ndim == 2 && emb->shape[1] == H && emb->shape[0] < c.vocab)
        return s_fail(self, KVEDGE_ESHAPE,
                      "config.json: vocab_size %u is larger than the embedding's %llu rows",
                      c.vocab, (unsigned long long)emb->shape[0]);
    if (s_tfind(ts, "model.layers.0.mlp.experts.0.gate_proj.weight") ||
        s_tfind(ts, "model.layers.0.block_sparse_moe.gate.weight"))
        return s_fail(self, KVEDGE_EINVAL, "the tensors hold mixture-of-experts layers");
    {
        char extra[S_NAME_BYTES];
        snprintf(extra, sizeof extra, "model.layers.%u.input_layernorm.weight", c.layers);
        if (s_tfind(ts, extra))
            return s_fail(self, KVEDGE_ESHAPE,
                          "the tensors hold more layers than num_hidden_layers %u (%s)", c.layers,
                          extra);
    }
    self->layer = calloc(c.layers, sizeof *self->layer);
    self->inv_freq = malloc(c.head_dim / 2 * sizeof(float));
    if (!self->layer || !self->inv_freq)
        return s_fail(self, KVEDGE_ENOMEM, "out of memory");
    self->rope = (kvedge_decoder_rope_t){.rotary = true,
                                         .theta = hf->rope_theta,
                                         .llama3 = hf->rope_llama3,
                                         .factor = hf->rope_factor,
                                         .low_freq_factor = hf->rope_low,
                                         .high_freq_factor = hf->rope_high,
                                         .original_max = hf->rope_orig_max};
    if (!hf->rope_llama3)
        self->rope.factor = self->rope.low_freq_factor = self->rope.high_freq_factor =
            self->rope.original_max = 0;
    /* HF's rotary frequencies, Llama 3's rope_scaling applied (rope.c). */
    if (kvedge_decoder_rope_freqs(&self->rope, c.head_dim, self->inv_freq) != KVEDGE_OK)
        return s_fail(self, KVEDGE_EINVAL, "config.json: rotary settings out of range");
    int rc = KVEDGE_OK;
#define S_TAKE(ptr, d0, d1, ...)                                                                   \
    do {                                                                                           \
        if (rc == KVEDGE_OK) {                                                                     \
            char what_[S_NAME_BYTES + 16];                                                         \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                            \
            rc = s_take(self, s_tfind(ts, what_), what_, (d0), (d1), &(ptr));                      \
        }                                                                                          \
    } while (0)
    S_TAKE(self->embed, c.vocab, H, "model.embed_tokens.weight");
    for (uint32_t l = 0; rc == KVEDGE_OK && l < c.layers; l++) {
        s_layer_t *L = &self->layer[l];
        const char *p = "model.layers";
        S_TAKE(L->ln1_w, H, 0, "%s.%u.input_layernorm.weight", p, l);
        S_TAKE(L->wq, QD, H, "%s.%u.self_attn.q_proj.weight", p, l);
        S_TAKE(L->wk, KD, H, "%s.%u.self_attn.k_proj.weight", p, l);
        S_TAKE(L->wv, KD, H, "%s.%u.self_attn.v_proj.weight", p, l);
        S_TAKE(L->wo, H, QD, "%s.%u.self_attn.o_proj.weight", p, l);
        if (qkv_bias) {
            S_TAKE(L->bq, QD, 0, "%s.%u.self_attn.q_proj.bias", p, l);
            S_TAKE(L->bk, KD, 0, "%s.%u.self_attn.k_proj.bias", p, l);
            S_TAKE(L->bv, KD, 0, "%s.%u.self_attn.v_proj.bias", p, l);
        }
        if (o_bias)
            S_TAKE(L->bo, H, 0, "%s.%u.self_attn.o_proj.bias", p, l);
        S_TAKE(L->ln2_w, H, 0, "%s.%u.post_attention_layernorm.weight", p, l);
        S_TAKE(L->fc1_w, F, H, "%s.%u.mlp.gate_proj.weight", p, l);
        S_TAKE(L->up_w, F, H, "%s.%u.mlp.up_proj.weight", p, l);
        S_TAKE(L->fc2_w, H, F, "%s.%u.mlp.down_proj.weight", p, l);
    }
    S_TAKE(self->lnf_w, H, 0, "model.norm.weight");
    self->head = self->embed;
    if (!hf->tie_embeddings)
        S_TAKE(self->head, c.vocab, H, "lm_head.weight");
#undef S_TAKE
    return rc;
}

/* Reads a whole small file (JSON) into a NUL-terminated buffer the caller frees; NULL with
 * errno set on failure (EFBIG: over S_JSON_MAX_BYTES). */
static char *s_read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= S_JSON_MAX_BYTES) {
                free(buf);
                fclose(f);
                errno = EFBIG;
                return NULL;
            }
            cap = cap ? cap * 2 : 4096;
            char *b = realloc(buf, cap + 1);
            if (!b) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Opens file (a name inside dir) as one more reader of ts. */
static int s_tset_open(kvedge_decoder_t *self, s_tset_t *ts, const char *dir, const char *file)
{
    if (ts->n >= S_MAX_SHARDS)
        return s_fail(self, KVEDGE_ETOOBIG, "model.safetensors.index.json: over %u shards",
                      S_MAX_SHARDS);
    kvedge_safetensors_t **st = realloc(ts->st, (ts->n + 1) * sizeof *st);
    if (st)
        ts->st = st;
    char **fl = realloc(ts->file, (ts->n + 1) * sizeof *fl);
    if (fl)
        ts->file = fl;
    char path[4096];
    if (!st || !fl)
        return s_fail(self, KVEDGE_ENOMEM, "out of memory");
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path)
        return s_fail(self, KVEDGE_EINVAL, "%s: path too long", file);
    ts->st[ts->n] = kvedge_safetensors_new();
    ts->file[ts->n] = strdup(file);
    if (!ts->st[ts->n] || !ts->file[ts->n]) {
        kvedge_safetensors_destroy(&ts->st[ts->n]);
        free(ts->file[ts->n]);
        return s_fail(self, KVEDGE_ENOMEM, "out of memory");
    }
    ts->n++;
    int rc = kvedge_safetensors_open(ts->st[ts->n - 1], path);
    if (rc != KVEDGE_OK)
        return s_fail(self, rc, "%s: %s", file, kvedge_safetensors_error(ts->st[ts->n - 1]));
    return KVEDGE_OK;
}

/* Opens the shards model.safetensors.index.json (text) names and checks that they agree
 * with it: every tensor the index maps is in the shard it names, and every tensor a shard
 * holds is mapped to that shard. */
static int s_open_index(kvedge_decoder_t *self, s_tset_t *ts, const char *dir, const char *text)
{
    const char *ix = "model.safetensors.index.json";
    cJSON *root = cJSON_Parse(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int rc = KVEDGE_OK;
    if (!cJSON_IsObject(map))
        rc = s_fail(self, KVEDGE_ECORRUPT, "%s: no weight_map object", ix);
    const cJSON *e;
    size_t entries = 0;
    cJSON_ArrayForEach(e, map)
    {
        if (rc != KVEDGE_OK)
            break;
        entries++;
        const char *file = cJSON_GetStringValue(e);
        if (!file || !*file || strchr(file, '/') || strcmp(file, "..") == 0 ||
            strcmp(file, ".") == 0) {
            rc = s_fail(self, KVEDGE_ECORRUPT, "%s: tensor %s names no shard file in dir", ix,
                        e->string);
            break;
        }
        size_t i = 0;
        while (i < ts->n && strcmp(ts->file[i], file) != 0)
            i++;
        if (i == ts->n && (rc = s_tset_open(self, ts, dir, file)) != KVEDGE_OK)
            break;
        if (!kvedge_safetensors_find(ts->st[i], e->string))
            rc = s_fail(self, KVEDGE_ECORRUPT, "%s: tensor %s is not in %s, where %s maps it", file,
                        e->string, file, ix);
    }
    for (size_t i = 0; rc == KVEDGE_OK && i < ts->n; i++)
        for (size_t j = 0; rc == KVEDGE_OK && j < kvedge_safetensors_count(ts->st[i]); j++) {
            const char *name = kvedge_safetensors_at(ts->st[i], j)->name;
            const char *file = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(map, name));
            if (!file || strcmp(file, ts->file[i]) != 0)
                rc = s_fail(self, KVEDGE_ECORRUPT, "%s: holds tensor %s, which %s maps %s%s",
                            ts->file[i], name, ix, file ? "to " : "nowhere", file ? file : "");
        }
    if (rc == KVEDGE_OK && entries == 0)
        rc = s_fail(self, KVEDGE_ECORRUPT, "%s: weight_map is empty", ix);
    cJSON_Delete(root);
    return rc;
}

/* True when config.json is a JSON object without "model_type": kvedge's own training folder
 * (scripts/train_models.py), whose config.json records the training run and whose
 * model.safetensors is an OPT file that carries its shape in its metadata. */
static bool s_config_untyped(const char *text, size_t len)
{
    cJSON *root = cJSON_ParseWithLength(text, len);
    const bool untyped = cJSON_IsObject(root) && !s_jfield(root, "model_type");
    cJSON_Delete(root);
    return untyped;
}

static int s_load_opt_file(kvedge_decoder_t *self, const char *path, uint32_t heads);

/* Loads a Hugging Face model directory: config.json, then single or sharded safetensors. A
 * config.json without model_type is kvedge's own OPT folder: its model.safetensors loads as
 * the OPT file form (the tensors and their metadata give the shape). */
static int s_load_dir(kvedge_decoder_t *self, const char *dir, uint32_t heads, s_tset_t *ts)
{
    char path[4096];
    size_t len = 0;
    if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors", dir) >= sizeof path)
        return s_fail(self, KVEDGE_EINVAL, "path too long");
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = s_read_text(path, &len);
    if (!text)
        return s_fail(self, errno == ENOMEM ? KVEDGE_ENOMEM : KVEDGE_EIO, "config.json: %s",
                      strerror(errno));
    if (s_config_untyped(text, len)) {
        free(text);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        struct stat sb;
        if (stat(path, &sb) != 0)
            return s_fail(self, KVEDGE_ECORRUPT,
                          "config.json: model_type is missing (and there is no "
                          "model.safetensors of kvedge's OPT form)");
        return s_load_opt_file(self, path, heads);
    }
    kvedge_decoder_impl_hf_config_t hf;
    char err[S_ERROR_BYTES];
    int rc = kvedge_decoder_impl_parse_config(text, len, &hf, err, sizeof err);
    free(text);
    if (rc != KVEDGE_OK)
        return s_fail(self, rc, "config.json: %s", err);
    if (heads && heads != hf.cfg.heads)
        return s_fail(self, KVEDGE_EINVAL,
                      "config.json: num_attention_heads %u, but %u heads were asked for",
                      hf.cfg.heads, heads);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    text = s_read_text(path, &len);
    if (text) {
        rc = s_open_index(self, ts, dir, text);
        free(text);
    } else if (errno == ENOENT) {
        rc = s_tset_open(self, ts, dir, "model.safetensors");
    } else {
        rc = s_fail(self, KVEDGE_EIO, "model.safetensors.index.json: %s", strerror(errno));
    }
    if (rc != KVEDGE_OK)
        return rc;
    if (strcmp(hf.model_type, "opt") != 0)
        return s_load_llama(self, ts, &hf);
    rc = s_load_opt(self, ts, hf.cfg.heads);
    if (rc == KVEDGE_OK && hf.cfg.layers && hf.cfg.layers != self->cfg.layers)
        rc = s_fail(self, KVEDGE_ESHAPE,
                    "config.json: num_hidden_layers %u, but the tensors hold %u layers",
                    hf.cfg.layers, self->cfg.layers);
    return rc;
}

/* Loads OPT from one safetensors file (the file form). */
static int s_load_opt_file(kvedge_decoder_t *self, const char *path, uint32_t heads)
{
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    if (!st)
        return s_fail(self, KVEDGE_ENOMEM, "out of memory");
    int rc = kvedge_safetensors_open(st, path);
    if (rc != KVEDGE_OK) {
        s_fail(self, rc, "%s", kvedge_safetensors_error(st));
        kvedge_safetensors_destroy(&st);
        return rc;
    }
    s_tset_t ts = {&st, NULL, 1};
    rc = s_load_opt(self, &ts, heads);
    kvedge_safetensors_destroy(&st);
    return rc;
}

int kvedge_decoder_load(kvedge_decoder_t *self, const char *path, uint32_t heads)
{
    if (!self || !path)
        return KVEDGE_EINVAL;
    if (self->layer)
        return s_fail(self, KVEDGE_EINVAL, "model already loaded");
    self->err[0] = '\0';
    s_tset_t ts = {0};
    struct stat sb;
    int rc;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        rc = s_load_dir(self, path, heads, &ts);
        if (rc != KVEDGE_OK) {
            /* "dir/file: what" when the detail names a file, else "dir: what". */
            char detail[S_ERROR_BYTES];
            snprintf(detail, sizeof detail, "%s", self->err);
            const char *colon = strstr(detail, ": ");
            const bool names_file = colon && memchr(detail, ' ', (size_t)(colon - detail)) == NULL;
            s_fail(self, rc, "%s%s%s", path, names_file ? "/" : ": ", detail);
        }
    } else {
        rc = s_load_opt_file(self, path, heads);
    }
    s_tset_free(&ts);
    if (rc != KVEDGE_OK)
        s_unload(self);
    return rc;
}

const char *kvedge_decoder_arch(const kvedge_decoder_t *self)
{
    return self && self->arch ? self->arch->model_type : "";
}

/* ---------------------------------------------------------------------------------------- */
/* Layer math                                                                                */

/* y[n][out] = x[n][in] W^T + b, with W [out][in] as nn.Linear stores it. */
static void s_linear(const float *x, uint32_t n, uint32_t in, const float *w, const float *b,
                     uint32_t out, float *y)
{
    for (uint32_t i = 0; b && i < n; i++)
        memcpy(y + (size_t)i * out, b, out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)in, 1.0f, x,
                (int)in, w, (int)in, b ? 1.0f : 0.0f, y, (int)out);
}

/* The model's norm over rows of width d: nn.LayerNorm (OPT), or RMSNorm, x / sqrt(mean(x^2) +
 * eps) * w (Llama family; b unused); statistics in double so the result does not depend on
 * the order of summation. */
static void s_norm(const kvedge_decoder_t *md, const float *x, uint32_t n, uint32_t d,
                   const float *w, const float *b, float *y)
{
    if (md->arch->rms_norm) {
        for (uint32_t i = 0; i < n; i++) {
            const float *xr = x + (size_t)i * d;
            float *yr = y + (size_t)i * d;
            double ms = 0;
            for (uint32_t j = 0; j < d; j++)
                ms += (double)xr[j] * xr[j];
            const double inv = 1.0 / sqrt(ms / d + md->norm_eps);
            for (uint32_t j = 0; j < d; j++)
                yr[j] = (float)(xr[j] * inv) * w[j];
        }
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        const float *xr = x + (size_t)i * d;
        float *yr = y + (size_t)i * d;
        double mean = 0, var = 0;
        for (uint32_t j = 0; j < d; j++)
            mean += xr[j];
        mean /= d;
        for (uint32_t j = 0; j < d; j++)
            var += (xr[j] - mean) * (xr[j] - mean);
        var /= d;
        const double inv = 1.0 / sqrt(var + md->norm_eps);
        for (uint32_t j = 0; j < d; j++)
            yr[j] = (float)((xr[j] - mean) * inv) * w[j] + b[j];
    }
}

/* Attention is gpu/attn.h's CPU path: one partial attention with its log-sum-exp per key set,
 * and the exact merge of two partials. */

/* Partial attention of the queries qh ([heads][n][head_dim], already scaled) over the first
 * keys tokens of kv. causal: query i sees keys j <= past + i (the local cache holds past
 * earlier tokens); else it sees all of them. Writes o [heads][n][head_dim], lse [heads][n]. */
static int s_attn_partial(const kvedge_decoder_t *md, const float *qh, uint32_t n, const float *k,
                          const float *v, uint32_t stride, uint32_t keys, bool causal,
                          uint32_t past, float *o, float *lse)
{
    const kvedge_decoder_config_t *c = &md->cfg;
    const size_t hd = c->head_dim;
    const uint32_t kvh = md->kv_heads, group = c->heads / kvh;
    kvedge_attn_partial_args_t a = {
        .dtype = KVEDGE_DTYPE_FP32,
        .heads = c->heads,
        .kv_heads = kvh,
        .nq = n,
        .n = keys,
        .head_dim = c->head_dim,
        .scale = 1.0f,
        .causal = causal,
        .causal_offset = past,
    };
    /* attn.h packs heads at keys * head_dim; a cache with room for more tokens goes head by
     * head. */
    const uint32_t calls = stride == keys ? 1 : c->heads;
    if (calls > 1)
        a.heads = a.kv_heads = 1;
    for (uint32_t h = 0; h < calls; h++) {
        a.q = qh + (size_t)h * n * hd;
        a.k = k + (size_t)(h / group) * stride * hd;
        a.v = v + (size_t)(h / group) * stride * hd;
        a.o = o + (size_t)h * n * hd;
        a.lse = lse + (size_t)h * n;
        int rc = kvedge_cpu_attn_partial(&a);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

/* Makes room for a pass of n tokens. */
static int s_work_reserve(s_work_t *w, const kvedge_decoder_t *md, uint32_t n)
{
    const kvedge_decoder_config_t *c = &md->cfg;
    const bool swiglu = md->arch->swiglu;
    const size_t H = c->hidden, QD = (size_t)c->heads * c->head_dim;
    const size_t KD = (size_t)md->kv_heads * c->head_dim, D = H > QD ? H : QD;
    const size_t F = (swiglu ? 2 : 1) * (size_t)c->ffn;
    const size_t need = (size_t)n * (H + D + 2 * KD + 4 * QD + F + 2 * (size_t)c->heads);
    if (need > w->cap) {
        float *b = realloc(w->buf, need * sizeof(float));
        if (!b)
            return KVEDGE_ENOMEM;
        w->buf = b;
        w->cap = need;
    }
    float *p = w->buf;
    w->ln = p, p += (size_t)n * H;
    w->q = p, p += (size_t)n * D;
    w->k = p, p += (size_t)n * KD;
    w->v = p, p += (size_t)n * KD;
    w->attn = p, p += (size_t)n * QD;
    w->ffn = p, p += (size_t)n * F;
    w->qh = p, p += (size_t)n * QD;
    w->oa = p, p += (size_t)n * QD;
    w->ob = p, p += (size_t)n * QD;
    w->lsea = p, p += (size_t)n * c->heads;
    w->lseb = p;
    return KVEDGE_OK;
}

/* K/V of one layer in [heads][stride][head_dim]; tokens [0, len) are valid. */
typedef struct {
    float *k, *v;
    uint32_t len, stride;
} s_kv_t;

/* Rotary positions in Hugging Face's rotate-half layout on rows [n][heads * head_dim] of
 * tokens at positions pos0..: for i < d/2, (x_i, x_{i+d/2}) turns by angle pos * inv_freq_i.
 * Angles and their sines in double, so a position's rotation does not depend on the pass. */
static void s_rotate(const kvedge_decoder_t *md, float *x, uint32_t n, uint32_t heads,
                     uint32_t pos0, float *cs)
{
    const uint32_t hd = md->cfg.head_dim, half = hd / 2;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t j = 0; j < half; j++) {
            const double a = (double)(pos0 + i) * md->inv_freq[j];
            cs[j] = (float)cos(a);
            cs[half + j] = (float)sin(a);
        }
        for (uint32_t h = 0; h < heads; h++) {
            float *r = x + ((size_t)i * heads + h) * hd;
            for (uint32_t j = 0; j < half; j++) {
                const float x1 = r[j], x2 = r[half + j];
                r[j] = x1 * cs[j] - x2 * cs[half + j];
                r[half + j] = x2 * cs[j] + x1 * cs[half + j];
            }
        }
    }
}

/* Runs layer l on the hidden states x [n][hidden] (tokens at positions pos0..) in place. The
 * n tokens attend to all of ext (context K/V, may be empty) and causally to loc, whose first
 * loc->len tokens are earlier local tokens; their own K/V is written to loc at loc->len ..
 * loc->len + n - 1 (loc->len is left for the caller to advance once every layer has run). */
static int s_layer_forward(const kvedge_decoder_t *md, uint32_t l, float *x, uint32_t n,
                           uint32_t pos0, const s_kv_t *ext, const s_kv_t *loc, s_work_t *w)
{
    const kvedge_decoder_config_t *c = &md->cfg;
    const s_layer_t *L = &md->layer[l];
    const uint32_t H = c->hidden, hd = c->head_dim, kvh = md->kv_heads;
    const uint32_t QD = c->heads * hd, KD = kvh * hd;
    if (s_work_reserve(w, md, n) != KVEDGE_OK)
        return KVEDGE_ENOMEM;

    s_norm(md, x, n, H, L->ln1_w, L->ln1_b, w->ln);
    s_linear(w->ln, n, H, L->wq, L->bq, QD, w->q);
    s_linear(w->ln, n, H, L->wk, L->bk, KD, w->k);
    s_linear(w->ln, n, H, L->wv, L->bv, KD, w->v);
    if (md->arch->rotary) { /* w->attn is free until attention writes it */
        s_rotate(md, w->q, n, c->heads, pos0, w->attn);
        s_rotate(md, w->k, n, kvh, pos0, w->attn);
    }
    /* HF scales q after its bias: q_proj(x) * head_dim^-0.5. Queries go head-major for
     * attn.h; the new K/V joins the local cache, which is head-major too. */
    const float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t h = 0; h < c->heads; h++)
        for (uint32_t i = 0; i < n; i++) {
            const size_t src = (size_t)i * QD + (size_t)h * hd;
            float *qd = w->qh + ((size_t)h * n + i) * hd;
            for (uint32_t j = 0; j < hd; j++)
                qd[j] = w->q[src + j] * scale;
        }
    for (uint32_t h = 0; h < kvh; h++)
        for (uint32_t i = 0; i < n; i++) {
            const size_t src = (size_t)i * KD + (size_t)h * hd;
            const size_t dst = ((size_t)h * loc->stride + loc->len + i) * hd;
            memcpy(loc->k + dst, w->k + src, hd * sizeof(float));
            memcpy(loc->v + dst, w->v + src, hd * sizeof(float));
        }

    /* Causally over the local cache; then, with a context, over all of its K/V, merged by
     * log-sum-exp into attention over the concatenation. */
    int rc = s_attn_partial(md, w->qh, n, loc->k, loc->v, loc->stride, loc->len + n, true, loc->len,
                            w->ob, w->lseb);
    const float *o = w->ob;
    if (rc == KVEDGE_OK && ext->len) {
        rc = s_attn_partial(md, w->qh, n, ext->k, ext->v, ext->stride, ext->len, false, 0, w->oa,
                            w->lsea);
        const kvedge_attn_merge_args_t mg = {
            .o1 = w->oa,
            .lse1 = w->lsea,
            .o2 = w->ob,
            .lse2 = w->lseb,
            .o = w->oa,
            .lse = w->lsea,
            .rows = c->heads * n,
            .head_dim = hd,
        };
        if (rc == KVEDGE_OK)
            rc = kvedge_cpu_attn_merge(&mg);
        o = w->oa;
    }
    if (rc != KVEDGE_OK)
        return rc;
    for (uint32_t h = 0; h < c->heads; h++)
        for (uint32_t i = 0; i < n; i++)
            memcpy(w->attn + (size_t)i * QD + (size_t)h * hd, o + ((size_t)h * n + i) * hd,
                   hd * sizeof(float));

    /* Residual adds go through the projection's output buffer: out = attn Wo^T + bo. */
    s_linear(w->attn, n, QD, L->wo, L->bo, H, w->q);
    for (size_t i = 0; i < (size_t)n * H; i++)
        x[i] += w->q[i];
    s_norm(md, x, n, H, L->ln2_w, L->ln2_b, w->ln);
    const size_t nf = (size_t)n * c->ffn;
    s_linear(w->ln, n, H, L->fc1_w, L->fc1_b, c->ffn, w->ffn);
    if (md->arch->swiglu) { /* silu(gate) * up, as HF's LlamaMLP */
        float *up = w->ffn + nf;
        s_linear(w->ln, n, H, L->up_w, NULL, c->ffn, up);
        for (size_t i = 0; i < nf; i++)
            w->ffn[i] = w->ffn[i] / (1.0f + expf(-w->ffn[i])) * up[i];
    } else {
        for (size_t i = 0; i < nf; i++)
            w->ffn[i] = w->ffn[i] > 0 ? w->ffn[i] : 0;
    }
    s_linear(w->ffn, n, c->ffn, L->fc2_w, L->fc2_b, H, w->q);
    for (size_t i = 0; i < (size_t)n * H; i++)
        x[i] += w->q[i];
    return KVEDGE_OK;
}

static bool s_tokens_ok(const kvedge_decoder_config_t *c, const int32_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (t[i] < 0 || (uint32_t)t[i] >= c->vocab)
            return false;
    return true;
}

/* x [n][hidden] = embed_tokens[t] + embed_positions[pos0 + i + 2]; rotary models: the token
 * embedding alone (positions enter in attention). */
static void s_embed(const kvedge_decoder_t *md, const int32_t *t, uint32_t n, uint32_t pos0,
                    float *x)
{
    const uint32_t H = md->cfg.hidden;
    if (!md->pos) {
        for (uint32_t i = 0; i < n; i++)
            memcpy(x + (size_t)i * H, md->embed + (size_t)t[i] * H, H * sizeof(float));
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        const float *e = md->embed + (size_t)t[i] * H;
        const float *p = md->pos + ((size_t)pos0 + i + KVEDGE_DECODER_POSITION_OFFSET) * H;
        for (uint32_t j = 0; j < H; j++)
            x[(size_t)i * H + j] = e[j] + p[j];
    }
}

/* Final LayerNorm of one hidden row, then the tied head. scratch holds hidden floats. */
static void s_logits(const kvedge_decoder_t *md, const float *xrow, float *scratch, float *logits)
{
    const kvedge_decoder_config_t *c = &md->cfg;
    s_norm(md, xrow, 1, c->hidden, md->lnf_w, md->lnf_b, scratch);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)c->vocab, (int)c->hidden, 1.0f, md->head,
                (int)c->hidden, scratch, 1, 0.0f, logits, 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Prefill                                                                                   */

/* A prefill through the first `layers` layers; logits only when that is all of them. */
static int s_prefill(const kvedge_decoder_t *self, const int32_t *tokens, uint32_t n,
                     uint32_t layers, float *logits, float *k_out, float *v_out,
                     kvedge_decoder_layer_fn trace, void *trace_arg)
{
    if (!self || !self->layer || !tokens || n == 0 || (!k_out != !v_out))
        return KVEDGE_EINVAL;
    const kvedge_decoder_config_t *c = &self->cfg;
    if (n > c->max_positions)
        return KVEDGE_ETOOBIG;
    if (!s_tokens_ok(c, tokens, n))
        return KVEDGE_EINVAL;
    const size_t kvf = kvedge_decoder_kv_floats(self, n);
    float *x = malloc((size_t)n * c->hidden * sizeof(float));
    float *tmp = k_out ? NULL : malloc(2 * kvf * sizeof(float));
    s_work_t w = {0};
    int rc = (x && (k_out || tmp)) ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK) {
        s_embed(self, tokens, n, 0, x);
        const s_kv_t none = {0};
        for (uint32_t l = 0; rc == KVEDGE_OK && l < layers; l++) {
            s_kv_t loc = {k_out ? k_out + l * kvf : tmp, v_out ? v_out + l * kvf : tmp + kvf, 0, n};
            rc = s_layer_forward(self, l, x, n, 0, &none, &loc, &w);
            if (rc == KVEDGE_OK && trace)
                rc = trace(trace_arg, l, x, n, w.qh, loc.k, loc.v); /* qh: this layer's */
        }
    }
    if (rc == KVEDGE_OK && logits && layers == c->layers)
        s_logits(self, x + (size_t)(n - 1) * c->hidden, w.ln, logits);
    free(w.buf);
    free(tmp);
    free(x);
    return rc;
}

int kvedge_decoder_prefill(const kvedge_decoder_t *self, const int32_t *tokens, uint32_t n,
                           float *logits, float *k_out, float *v_out)
{
    return s_prefill(self, tokens, n, self ? self->cfg.layers : 0, logits, k_out, v_out, NULL,
                     NULL);
}

int kvedge_decoder_prefill_trace(const kvedge_decoder_t *self, const int32_t *tokens, uint32_t n,
                                 kvedge_decoder_layer_fn trace, void *arg)
{
    if (!trace)
        return KVEDGE_EINVAL;
    return s_prefill(self, tokens, n, self ? self->cfg.layers : 0, NULL, NULL, NULL, trace, arg);
}

/* ---------------------------------------------------------------------------------------- */
/* Decode sessions                                                                           */

kvedge_decoder_session_t *kvedge_decoder_session_new(const kvedge_decoder_t *model)
{
    if (!model || !model->layer)
        return NULL;
    kvedge_decoder_session_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->model = model;
    self->logits = malloc(model->cfg.vocab * sizeof(float));
    if (!self->logits)
        free(self), self = NULL;
    return self;
}

/* Frees what a decode allocates beyond the reserved buffers (the context's hidden state and
 * the rerun scratch) and forgets the decode's progress; the session can be begun again. */
static void s_session_reset(kvedge_decoder_session_t *self)
{
    free(self->ctx_tmp_v);
    free(self->ctx_tmp_k);
    free(self->ctx_h);
    self->ctx_tmp_v = self->ctx_tmp_k = self->ctx_h = NULL;
    self->ctx_layer = self->loc_len = 0;
    self->ready = false;
}

/* Frees the per-decode buffers, reserved ones included; the session can be begun again. */
static void s_session_clear(kvedge_decoder_session_t *self)
{
    s_session_reset(self);
    free(self->x);
    free(self->loc_v);
    free(self->loc_k);
    free(self->ctx_v);
    free(self->ctx_k);
    free(self->ctx_tokens);
    self->x = self->loc_v = self->loc_k = self->ctx_v = self->ctx_k = NULL;
    self->ctx_tokens = NULL;
    self->ctx_len = self->loc_cap = self->res_ctx = self->res_loc = 0;
    self->reserved = false;
}

/* Allocates the context and local buffers of a decode of ctx_len context tokens and loc_cap
 * local ones (the session is clear). */
static int s_session_alloc(kvedge_decoder_session_t *self, uint32_t ctx_len, uint32_t loc_cap)
{
    const kvedge_decoder_t *md = self->model;
    const kvedge_decoder_config_t *c = &md->cfg;
    const size_t ckv = c->layers * kvedge_decoder_kv_floats(md, ctx_len);
    const size_t lkv = c->layers * kvedge_decoder_kv_floats(md, loc_cap);
    self->ctx_tokens = malloc((ctx_len ? ctx_len : 1) * sizeof(int32_t));
    /* Big: the loader dequantizes fetched layers into ctx_k and ctx_v while the fetch runs. */
    self->ctx_k = kvedge_big_alloc(ckv * sizeof(float));
    self->ctx_v = kvedge_big_alloc(ckv * sizeof(float));
    self->loc_k = kvedge_big_alloc(lkv * sizeof(float));
    self->loc_v = kvedge_big_alloc(lkv * sizeof(float));
    self->x = malloc((size_t)loc_cap * c->hidden * sizeof(float));
    if (!self->ctx_tokens || !self->ctx_k || !self->ctx_v || !self->loc_k || !self->loc_v ||
        !self->x) {
        s_session_clear(self);
        return KVEDGE_ENOMEM;
    }
    self->ctx_len = ctx_len;
    self->loc_cap = loc_cap;
    return KVEDGE_OK;
}

/* Bytes of context and local K/V held by a decode of ctx_len and loc_cap tokens. */
static uint64_t s_kv_bytes(const kvedge_decoder_t *md, uint32_t ctx_len, uint32_t loc_cap)
{
    return 2ull * md->cfg.layers * sizeof(float) *
           (kvedge_decoder_kv_floats(md, ctx_len) + kvedge_decoder_kv_floats(md, loc_cap));
}

void kvedge_decoder_session_destroy(kvedge_decoder_session_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_decoder_session_t *self = *self_p;
    s_session_clear(self);
    free(self->work.buf);
    free(self->logits);
    free(self);
    *self_p = NULL;
}

/* Runs the context's hidden state forward until layer l has run, leaving layer l's K/V in the
 * context cache. Layers before l that were fetched are rerun only for their hidden output;
 * their recomputed K/V goes to a scratch pair so the fetched copy stays in use. */
static int s_ctx_advance(kvedge_decoder_session_t *self, uint32_t l)
{
    const kvedge_decoder_t *md = self->model;
    const size_t kvf = kvedge_decoder_kv_floats(md, self->ctx_len);
    if (!self->ctx_h) {
        self->ctx_h = malloc((size_t)self->ctx_len * md->cfg.hidden * sizeof(float));
        if (!self->ctx_h)
            return KVEDGE_ENOMEM;
        s_embed(md, self->ctx_tokens, self->ctx_len, 0, self->ctx_h);
        self->ctx_layer = 0;
        self->kv_bytes += (uint64_t)self->ctx_len * md->cfg.hidden * sizeof(float);
    }
    const s_kv_t none = {0};
    while (self->ctx_layer <= l) {
        const uint32_t j = self->ctx_layer;
        s_kv_t loc = {self->ctx_k + j * kvf, self->ctx_v + j * kvf, 0, self->ctx_len};
        if (j < l) {
            if (!self->ctx_tmp_k) {
                self->ctx_tmp_k = malloc(kvf * sizeof(float));
                self->ctx_tmp_v = malloc(kvf * sizeof(float));
                if (!self->ctx_tmp_k || !self->ctx_tmp_v)
                    return KVEDGE_ENOMEM;
                self->kv_bytes += 2ull * kvf * sizeof(float);
            }
            loc.k = self->ctx_tmp_k;
            loc.v = self->ctx_tmp_v;
        }
        int rc = s_layer_forward(md, j, self->ctx_h, self->ctx_len, 0, &none, &loc, &self->work);
        if (rc != KVEDGE_OK)
            return rc;
        self->ctx_layer++;
    }
    return KVEDGE_OK;
}

/* Runs n local tokens (already embedded in self->x) through every layer, fetching or
 * recomputing context K/V on the way when provider is set, then writes the logits. */
static int s_session_run(kvedge_decoder_session_t *self, uint32_t n, kvedge_decoder_kv_fn provider,
                         void *arg)
{
    const kvedge_decoder_t *md = self->model;
    const size_t ckvf = kvedge_decoder_kv_floats(md, self->ctx_len);
    const size_t lkvf = kvedge_decoder_kv_floats(md, self->loc_cap);
    for (uint32_t l = 0; l < md->cfg.layers; l++) {
        float *ck = self->ctx_k ? self->ctx_k + l * ckvf : NULL;
        float *cv = self->ctx_v ? self->ctx_v + l * ckvf : NULL;
        if (provider && self->ctx_len) {
            int rc = provider(arg, l, ck, cv);
            if (rc == KVEDGE_DECODER_MISS)
                rc = s_ctx_advance(self, l);
            else if (rc == KVEDGE_DECODER_IN_PLACE) /* only lent storage can be filled so */
                rc = self->reserved ? KVEDGE_OK : KVEDGE_EINVAL;
            else if (rc > 0)
                rc = KVEDGE_EINVAL; /* a provider must say 0, MISS or an error */
            if (rc != KVEDGE_OK)
                return rc;
        }
        const s_kv_t ext = {ck, cv, self->ctx_len, self->ctx_len};
        const s_kv_t loc = {self->loc_k + l * lkvf, self->loc_v + l * lkvf, self->loc_len,
                            self->loc_cap};
        int rc = s_layer_forward(md, l, self->x, n, self->ctx_len + self->loc_len, &ext, &loc,
                                 &self->work);
        if (rc != KVEDGE_OK)
            return rc;
    }
    self->loc_len += n;
    s_logits(md, self->x + (size_t)(n - 1) * md->cfg.hidden, self->work.ln, self->logits);
    return KVEDGE_OK;
}

int kvedge_decoder_session_reserve(kvedge_decoder_session_t *self, uint32_t ctx_len,
                                   uint32_t prompt_len, uint32_t max_new)
{
    if (!self)
        return KVEDGE_EINVAL;
    s_session_clear(self);
    self->kv_bytes = 0;
    if (prompt_len == 0)
        return KVEDGE_EINVAL;
    if ((uint64_t)ctx_len + prompt_len + max_new > self->model->cfg.max_positions)
        return KVEDGE_ETOOBIG;
    int rc = s_session_alloc(self, ctx_len, prompt_len + max_new);
    if (rc != KVEDGE_OK)
        return rc;
    self->reserved = true;
    self->res_ctx = ctx_len;
    self->res_loc = prompt_len + max_new;
    self->kv_bytes = s_kv_bytes(self->model, ctx_len, self->res_loc);
    return KVEDGE_OK;
}

int kvedge_decoder_session_ctx_kv(kvedge_decoder_session_t *self, uint32_t layer, float **k,
                                  float **v)
{
    if (k)
        *k = NULL;
    if (v)
        *v = NULL;
    if (!self || !k || !v || !self->reserved || self->res_ctx == 0 ||
        layer >= self->model->cfg.layers)
        return KVEDGE_EINVAL;
    const size_t kvf = kvedge_decoder_kv_floats(self->model, self->res_ctx);
    *k = self->ctx_k + layer * kvf;
    *v = self->ctx_v + layer * kvf;
    return KVEDGE_OK;
}

uint64_t kvedge_decoder_session_kv_bytes(const kvedge_decoder_session_t *self)
{
    return self ? self->kv_bytes : 0;
}

int kvedge_decoder_session_begin(kvedge_decoder_session_t *self, const int32_t *ctx_tokens,
                                 uint32_t ctx_len, kvedge_decoder_kv_fn provider, void *arg,
                                 const int32_t *prompt, uint32_t prompt_len, uint32_t max_new,
                                 float *logits)
{
    if (!self)
        return KVEDGE_EINVAL;
    /* Reserved storage may be lent to a loader still writing it: never freed here. */
    if (self->reserved)
        s_session_reset(self);
    else
        s_session_clear(self);
    self->kv_bytes = self->reserved ? s_kv_bytes(self->model, self->res_ctx, self->res_loc) : 0;
    const kvedge_decoder_t *md = self->model;
    const kvedge_decoder_config_t *c = &md->cfg;
    if (!prompt || prompt_len == 0 || (ctx_len && (!ctx_tokens || !provider)))
        return KVEDGE_EINVAL;
    if ((uint64_t)ctx_len + prompt_len + max_new > c->max_positions)
        return KVEDGE_ETOOBIG;
    if (!s_tokens_ok(c, ctx_tokens, ctx_len) || !s_tokens_ok(c, prompt, prompt_len))
        return KVEDGE_EINVAL;

    if (self->reserved) {
        if (ctx_len != self->res_ctx || (uint64_t)prompt_len + max_new > self->res_loc)
            return KVEDGE_EINVAL;
        self->loc_cap = prompt_len + max_new; /* strides shrink; the buffers stay */
    } else {
        int rc = s_session_alloc(self, ctx_len, prompt_len + max_new);
        if (rc != KVEDGE_OK)
            return rc;
    }
    self->kv_bytes = s_kv_bytes(md, ctx_len, self->reserved ? self->res_loc : self->loc_cap);
    if (ctx_len)
        memcpy(self->ctx_tokens, ctx_tokens, ctx_len * sizeof(int32_t));

    s_embed(md, prompt, prompt_len, ctx_len, self->x);
    int rc = s_session_run(self, prompt_len, provider, arg);
    if (rc != KVEDGE_OK) {
        if (self->reserved)
            s_session_reset(self);
        else
            s_session_clear(self);
        return rc;
    }
    /* The context's hidden state is only needed while a layer may still MISS. */
    free(self->ctx_h);
    free(self->ctx_tmp_k);
    free(self->ctx_tmp_v);
    self->ctx_h = self->ctx_tmp_k = self->ctx_tmp_v = NULL;
    self->ready = true;
    if (logits)
        memcpy(logits, self->logits, c->vocab * sizeof(float));
    return KVEDGE_OK;
}

int kvedge_decoder_session_step(kvedge_decoder_session_t *self, int32_t token, float *logits)
{
    if (!self || !self->ready || !s_tokens_ok(&self->model->cfg, &token, 1))
        return KVEDGE_EINVAL;
    if (self->loc_len >= self->loc_cap)
        return KVEDGE_ENOSPACE;
    s_embed(self->model, &token, 1, self->ctx_len + self->loc_len, self->x);
    int rc = s_session_run(self, 1, NULL, NULL);
    if (rc != KVEDGE_OK) {
        self->ready = false;
        return rc;
    }
    if (logits)
        memcpy(logits, self->logits, self->model->cfg.vocab * sizeof(float));
    return KVEDGE_OK;
}

int32_t kvedge_decoder_argmax(const float *logits, uint32_t vocab)
{
    uint32_t best = 0;
    for (uint32_t j = 1; j < vocab; j++)
        if (logits[j] > logits[best])
            best = j;
    return (int32_t)best;
}

int32_t kvedge_decoder_pick(const float *logits, uint32_t vocab, const int32_t *seen, size_t n,
                            float penalty)
{
    int32_t best = kvedge_decoder_argmax(logits, vocab);
    if (!(penalty > 1.0f) || n == 0 || !seen)
        return best;
    /* Only seen tokens change, and only downwards: the winner is the best of the unseen
     * arg-max and the penalized seen ones. */
    float best_v = -INFINITY;
    best = -1;
    for (uint32_t i = 0; i < vocab; i++) {
        float v = logits[i];
        for (size_t j = 0; j < n; j++)
            if (seen[j] == (int32_t)i) {
                v = v > 0 ? v / penalty : v * penalty;
                break;
            }
        if (best < 0 || v > best_v) {
            best_v = v;
            best = (int32_t)i;
        }
    }
    return best;
}

int kvedge_decoder_session_generate(kvedge_decoder_session_t *self, uint32_t n, int32_t *tokens)
{
    if (!self || !self->ready || (n && !tokens))
        return KVEDGE_EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        tokens[i] = kvedge_decoder_argmax(self->logits, self->model->cfg.vocab);
        int rc = kvedge_decoder_session_step(self, tokens[i], NULL);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

const float *kvedge_decoder_session_logits(const kvedge_decoder_session_t *self)
{
    return self && self->ready ? self->logits : NULL;
}

uint32_t kvedge_decoder_session_local_tokens(const kvedge_decoder_session_t *self)
{
    return self ? self->loc_len : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Internal to the library (clients/decoder_impl.h)                                          */

uint64_t kvedge_decoder_impl_weight_bytes(const kvedge_decoder_t *self)
{
    return self ? self->weight_bytes : 0;
}

int kvedge_decoder_impl_prefill_layers(const kvedge_decoder_t *self, const int32_t *tokens,
                                       uint32_t n, uint32_t layers)
{
    if (!self || layers == 0 || layers > self->cfg.layers)
        return KVEDGE_EINVAL;
    return s_prefill(self, tokens, n, layers, NULL, NULL, NULL, NULL, NULL);
}

int kvedge_decoder_impl_learned(const kvedge_decoder_t *self,
                                void (*fn)(void *arg, kvedge_decoder_impl_learn_t *learn),
                                void *arg)
{
    if (!self || !fn)
        return KVEDGE_EINVAL;
    /* Like the cost cache: guarded state on an otherwise read-only model. */
    kvedge_decoder_t *md = (kvedge_decoder_t *)self;
    pthread_mutex_lock(&md->learn_lock);
    fn(arg, &md->learn);
    pthread_mutex_unlock(&md->learn_lock);
    return KVEDGE_OK;
}

int kvedge_decoder_impl_costs(const kvedge_decoder_t *self, kvedge_decoder_impl_measure_fn measure,
                              kvedge_decoder_impl_cost_t *cost)
{
    if (cost)
        memset(cost, 0, sizeof *cost);
    if (!self || !self->layer || !measure || !cost)
        return KVEDGE_EINVAL;
    /* The model is otherwise read-only; this cache is its one guarded exception. Models are
     * only ever allocated non-const, so dropping the qualifier here is sound. */
    kvedge_decoder_t *md = (kvedge_decoder_t *)self;
    pthread_mutex_lock(&md->cost_lock);
    int rc = KVEDGE_OK;
    if (!md->cost_known) {
        kvedge_decoder_impl_cost_t c = {0};
        rc = measure(self, &c);
        if (rc == KVEDGE_OK && !(c.dense_rate > 0 && isfinite(c.dense_rate) && c.fixed_s >= 0 &&
                                 isfinite(c.fixed_s) && c.score_s >= 0 && isfinite(c.score_s)))
            rc = KVEDGE_EINVAL;
        if (rc == KVEDGE_OK) {
            md->cost = c;
            md->cost_known = true;
        }
    }
    if (rc == KVEDGE_OK)
        *cost = md->cost;
    pthread_mutex_unlock(&md->cost_lock);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* The GPU decoder's view of the weights (clients/decoder/decoder_gpu.h)                     */

int kvedge_decoder_gpu_weights(const kvedge_decoder_t *model, kvedge_gpu_opt_weights_t *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!model || !out || !model->layer || model->arch->rotary) /* the GPU decoder is OPT's */
        return KVEDGE_EINVAL;
    const kvedge_decoder_config_t *c = &model->cfg;
    kvedge_gpu_opt_layer_t *ly = calloc(c->layers, sizeof *ly);
    if (!ly)
        return KVEDGE_ENOMEM;
    for (uint32_t l = 0; l < c->layers; l++) {
        const s_layer_t *L = &model->layer[l];
        ly[l] = (kvedge_gpu_opt_layer_t){
            .ln1_w = L->ln1_w,
            .ln1_b = L->ln1_b,
            .wq = L->wq,
            .bq = L->bq,
            .wk = L->wk,
            .bk = L->bk,
            .wv = L->wv,
            .bv = L->bv,
            .wo = L->wo,
            .bo = L->bo,
            .ln2_w = L->ln2_w,
            .ln2_b = L->ln2_b,
            .fc1_w = L->fc1_w,
            .fc1_b = L->fc1_b,
            .fc2_w = L->fc2_w,
            .fc2_b = L->fc2_b,
        };
    }
    out->cfg = (kvedge_gpu_opt_config_t){c->layers, c->heads, c->head_dim,     c->hidden,
                                         c->ffn,    c->vocab, c->max_positions};
    out->embed_tokens = model->embed;
    out->embed_positions = model->pos;
    out->final_ln_w = model->lnf_w;
    out->final_ln_b = model->lnf_b;
    out->lm_head = model->head;
    out->layer = ly;
    return KVEDGE_OK;
}

void kvedge_decoder_gpu_weights_free(kvedge_gpu_opt_weights_t *w)
{
    if (!w)
        return;
    free((void *)w->layer);
    memset(w, 0, sizeof *w);
}
