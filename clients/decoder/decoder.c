/* The reference OPT decoder: fp32 on the CPU with OpenBLAS, Hugging Face OPT semantics
 * (pre-LayerNorm, learned positions with an offset of 2, ReLU FFN, tied output head). */
#include "clients/decoder/decoder.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

typedef struct {
    const float *ln1_w, *ln1_b; /* self_attn_layer_norm */
    const float *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
    const float *ln2_w, *ln2_b; /* final_layer_norm of the block, before the FFN */
    const float *fc1_w, *fc1_b, *fc2_w, *fc2_b;
} s_layer_t;

struct _kvedge_decoder_t {
    kvedge_decoder_config_t cfg; /* shape, zero until loaded */
    const float *embed;          /* embed_tokens [vocab][hidden] */
    const float *pos;            /* embed_positions [max_positions + 2][hidden] */
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
    float *q;           /* [n][hidden] queries, then projection outputs */
    float *k, *v;       /* [n][hidden] new keys and values, token-major */
    float *attn;        /* [n][hidden] merged attention output */
    float *ffn;         /* [n][ffn] */
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
    float *ctx_k, *ctx_v;          /* [layers][heads][ctx_len][head_dim] context K/V */
    float *ctx_h;                  /* [ctx_len][hidden] context hidden at ctx_layer's input */
    uint32_t ctx_layer;            /* layers the context has been run through */
    float *ctx_tmp_k, *ctx_tmp_v;  /* [heads][ctx_len][head_dim] K/V of a fetched layer rerun */
    uint32_t loc_len;              /* tokens in the local cache */
    uint32_t loc_cap;              /* prompt plus max_new */
    float *loc_k, *loc_v;          /* [layers][heads][loc_cap][head_dim] local K/V */
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
    return self ? (size_t)self->cfg.heads * tokens * self->cfg.head_dim : 0;
}

/* Where the file keeps the decoder's tensors: "model.decoder." or "decoder.". */
typedef struct {
    const kvedge_safetensors_t *st;
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
    return kvedge_safetensors_find(nm->st, name);
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
    const char *s = kvedge_safetensors_metadata(st, key);
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
    const char *pre = kvedge_safetensors_metadata(nm->st, "do_layer_norm_before");
    const char *act = kvedge_safetensors_metadata(nm->st, "activation_function");
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

    long mh = s_meta_count(nm->st, "num_attention_heads");
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
    return KVEDGE_OK;
}

int kvedge_decoder_load(kvedge_decoder_t *self, const char *path, uint32_t heads)
{
    if (!self || !path)
        return KVEDGE_EINVAL;
    if (self->layer)
        return s_fail(self, KVEDGE_EINVAL, "model already loaded");
    self->err[0] = '\0';
    kvedge_safetensors_t *st = kvedge_safetensors_new();
    if (!st)
        return s_fail(self, KVEDGE_ENOMEM, "out of memory");
    int rc = kvedge_safetensors_open(st, path);
    if (rc != KVEDGE_OK) {
        s_fail(self, rc, "%s", kvedge_safetensors_error(st));
        kvedge_safetensors_destroy(&st);
        return rc;
    }
    /* HF checkpoints of OPTForCausalLM say "model.decoder.", those of OPTModel "decoder.". */
    s_names_t nm = {st, "model.decoder."};
    if (!s_find(&nm, "embed_tokens.weight"))
        nm.prefix = "decoder.";

    rc = s_config(self, &nm, heads);
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
            const kvedge_safetensors_tensor_t *t_ = kvedge_safetensors_find(st, what_);            \
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
    if (rc == KVEDGE_OK && kvedge_safetensors_find(st, "lm_head.weight"))
        S_TAKE(self->head, c.vocab, c.hidden, "lm_head.weight");
#undef S_TAKE
    kvedge_safetensors_destroy(&st);
    if (rc != KVEDGE_OK)
        s_unload(self);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Layer math                                                                                */

/* y[n][out] = x[n][in] W^T + b, with W [out][in] as nn.Linear stores it. */
static void s_linear(const float *x, uint32_t n, uint32_t in, const float *w, const float *b,
                     uint32_t out, float *y)
{
    for (uint32_t i = 0; i < n; i++)
        memcpy(y + (size_t)i * out, b, out * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)in, 1.0f, x,
                (int)in, w, (int)in, 1.0f, y, (int)out);
}

/* nn.LayerNorm over rows of width d; statistics in double so the result does not depend on
 * the order of summation. */
static void s_layer_norm(const float *x, uint32_t n, uint32_t d, const float *w, const float *b,
                         float *y)
{
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
        const double inv = 1.0 / sqrt(var + S_LAYER_NORM_EPS);
        for (uint32_t j = 0; j < d; j++)
            yr[j] = (float)((xr[j] - mean) * inv) * w[j] + b[j];
    }
}

/* Attention is gpu/attn.h's CPU path: one partial attention with its log-sum-exp per key set,
 * and the exact merge of two partials. */

/* Partial attention of the queries qh ([heads][n][head_dim], already scaled) over the first
 * keys tokens of kv. causal: query i sees keys j <= past + i (the local cache holds past
 * earlier tokens); else it sees all of them. Writes o [heads][n][head_dim], lse [heads][n]. */
static int s_attn_partial(const kvedge_decoder_config_t *c, const float *qh, uint32_t n,
                          const float *k, const float *v, uint32_t stride, uint32_t keys,
                          bool causal, uint32_t past, float *o, float *lse)
{
    const size_t hd = c->head_dim;
    kvedge_attn_partial_args_t a = {
        .dtype = KVEDGE_DTYPE_FP32,
        .heads = c->heads,
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
        a.heads = 1;
    for (uint32_t h = 0; h < calls; h++) {
        a.q = qh + (size_t)h * n * hd;
        a.k = k + (size_t)h * stride * hd;
        a.v = v + (size_t)h * stride * hd;
        a.o = o + (size_t)h * n * hd;
        a.lse = lse + (size_t)h * n;
        int rc = kvedge_cpu_attn_partial(&a);
        if (rc != KVEDGE_OK)
            return rc;
    }
    return KVEDGE_OK;
}

/* Makes room for a pass of n tokens. */
static int s_work_reserve(s_work_t *w, const kvedge_decoder_config_t *c, uint32_t n)
{
    const size_t H = c->hidden;
    const size_t need = (size_t)n * (8 * H + c->ffn + 2 * (size_t)c->heads);
    if (need > w->cap) {
        float *b = realloc(w->buf, need * sizeof(float));
        if (!b)
            return KVEDGE_ENOMEM;
        w->buf = b;
        w->cap = need;
    }
    float *p = w->buf;
    w->ln = p, p += (size_t)n * H;
    w->q = p, p += (size_t)n * H;
    w->k = p, p += (size_t)n * H;
    w->v = p, p += (size_t)n * H;
    w->attn = p, p += (size_t)n * H;
    w->ffn = p, p += (size_t)n * c->ffn;
    w->qh = p, p += (size_t)n * H;
    w->oa = p, p += (size_t)n * H;
    w->ob = p, p += (size_t)n * H;
    w->lsea = p, p += (size_t)n * c->heads;
    w->lseb = p;
    return KVEDGE_OK;
}

/* K/V of one layer in [heads][stride][head_dim]; tokens [0, len) are valid. */
typedef struct {
    float *k, *v;
    uint32_t len, stride;
} s_kv_t;

/* Runs layer l on the hidden states x [n][hidden] in place. The n tokens attend to all of ext
 * (context K/V, may be empty) and causally to loc, whose first loc->len tokens are earlier
 * local tokens; their own K/V is written to loc at loc->len .. loc->len + n - 1 (loc->len is
 * left for the caller to advance once every layer has run). */
static int s_layer_forward(const kvedge_decoder_t *md, uint32_t l, float *x, uint32_t n,
                           const s_kv_t *ext, const s_kv_t *loc, s_work_t *w)
{
    const kvedge_decoder_config_t *c = &md->cfg;
    const s_layer_t *L = &md->layer[l];
    const uint32_t H = c->hidden, hd = c->head_dim;
    if (s_work_reserve(w, c, n) != KVEDGE_OK)
        return KVEDGE_ENOMEM;

    s_layer_norm(x, n, H, L->ln1_w, L->ln1_b, w->ln);
    s_linear(w->ln, n, H, L->wq, L->bq, H, w->q);
    s_linear(w->ln, n, H, L->wk, L->bk, H, w->k);
    s_linear(w->ln, n, H, L->wv, L->bv, H, w->v);
    /* HF scales q after its bias: q_proj(x) * head_dim^-0.5. Queries go head-major for
     * attn.h; the new K/V joins the local cache, which is head-major too. */
    const float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t h = 0; h < c->heads; h++)
        for (uint32_t i = 0; i < n; i++) {
            const size_t src = (size_t)i * H + (size_t)h * hd;
            const size_t dst = ((size_t)h * loc->stride + loc->len + i) * hd;
            float *qd = w->qh + ((size_t)h * n + i) * hd;
            for (uint32_t j = 0; j < hd; j++)
                qd[j] = w->q[src + j] * scale;
            memcpy(loc->k + dst, w->k + src, hd * sizeof(float));
            memcpy(loc->v + dst, w->v + src, hd * sizeof(float));
        }

    /* Causally over the local cache; then, with a context, over all of its K/V, merged by
     * log-sum-exp into attention over the concatenation. */
    int rc = s_attn_partial(c, w->qh, n, loc->k, loc->v, loc->stride, loc->len + n, true, loc->len,
                            w->ob, w->lseb);
    const float *o = w->ob;
    if (rc == KVEDGE_OK && ext->len) {
        rc = s_attn_partial(c, w->qh, n, ext->k, ext->v, ext->stride, ext->len, false, 0, w->oa,
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
            memcpy(w->attn + (size_t)i * H + (size_t)h * hd, o + ((size_t)h * n + i) * hd,
                   hd * sizeof(float));

    /* Residual adds go through the projection's output buffer: out = attn Wo^T + bo. */
    s_linear(w->attn, n, H, L->wo, L->bo, H, w->q);
    for (size_t i = 0; i < (size_t)n * H; i++)
        x[i] += w->q[i];
    s_layer_norm(x, n, H, L->ln2_w, L->ln2_b, w->ln);
    s_linear(w->ln, n, H, L->fc1_w, L->fc1_b, c->ffn, w->ffn);
    for (size_t i = 0; i < (size_t)n * c->ffn; i++)
        w->ffn[i] = w->ffn[i] > 0 ? w->ffn[i] : 0;
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

/* x [n][hidden] = embed_tokens[t] + embed_positions[pos0 + i + 2]. */
static void s_embed(const kvedge_decoder_t *md, const int32_t *t, uint32_t n, uint32_t pos0,
                    float *x)
{
    const uint32_t H = md->cfg.hidden;
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
    s_layer_norm(xrow, 1, c->hidden, md->lnf_w, md->lnf_b, scratch);
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
            rc = s_layer_forward(self, l, x, n, &none, &loc, &w);
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
        int rc = s_layer_forward(md, j, self->ctx_h, self->ctx_len, &none, &loc, &self->work);
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
        int rc = s_layer_forward(md, l, self->x, n, &ext, &loc, &self->work);
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
    if (!model || !out || !model->layer)
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
