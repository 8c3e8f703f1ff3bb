/* libkvedge_llamacpp.so (engine.h): a GGUF loaded by llama.cpp with one context, and the
 * bridge's import, export, model check and generation on it. */
#include "clients/llamacpp/engine.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "access/codec/error.h"

struct kvedge_llamacpp_engine {
    struct llama_model *model;
    struct llama_context *ctx;
    kvedge_llamacpp_model_t mi;      /* the GGUF's shape and rotary settings */
    kvedge_llamacpp_layout_t layout; /* the context's cache */
    kvedge_model_t rec;              /* the kvedge record under the caller's id */
    uint32_t vocab, n_ctx, n_seq;
};

static void s_why(char *why, size_t len, const char *fmt, ...)
{
    if (!why || len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

static double s_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void s_clear_why(char *why, size_t len)
{
    if (why && len)
        why[0] = '\0';
}

void kvedge_llamacpp_engine_opts_default(kvedge_llamacpp_engine_opts_t *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->n_seq = 1;
    o->cache = KVEDGE_LLAMACPP_F16;
}

size_t kvedge_llamacpp_engine_sizeof(const char *type)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {
        {"kvedge_llamacpp_engine_opts_t", sizeof(kvedge_llamacpp_engine_opts_t)},
        {"kvedge_llamacpp_import_t", sizeof(kvedge_llamacpp_import_t)},
        {"kvedge_llamacpp_import_stats_t", sizeof(kvedge_llamacpp_import_stats_t)},
        {"kvedge_llamacpp_export_t", sizeof(kvedge_llamacpp_export_t)},
        {"kvedge_llamacpp_export_stats_t", sizeof(kvedge_llamacpp_export_stats_t)},
        {"kvedge_model_t", sizeof(kvedge_model_t)},
        {"kvedge_chunk_id_t", sizeof(kvedge_chunk_id_t)},
    };
    for (size_t i = 0; type && i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(type, sizes[i].name) == 0)
            return sizes[i].size;
    return 0;
}

int kvedge_llamacpp_engine_version(char *why, size_t why_len)
{
    s_clear_why(why, why_len);
    return kvedge_llamacpp_version_check(why, why_len);
}

/* Loads the model and reads it as the kvedge record under id. */
static int s_load(kvedge_llamacpp_engine_t *e, const char *path, const char *id, char *why,
                  size_t why_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        s_why(why, why_len, "%s: %s", path, strerror(errno));
        return KVEDGE_EIO;
    }
    fclose(f);
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    e->model = llama_model_load_from_file(path, mp);
    if (!e->model) {
        s_why(why, why_len, "%s: llama.cpp cannot load it (not a GGUF model it reads)", path);
        return KVEDGE_EIO;
    }
    e->vocab = (uint32_t)llama_vocab_n_tokens(llama_model_get_vocab(e->model));
    int rc = kvedge_llamacpp_model_info(e->model, path, NULL, &e->mi, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    rc = kvedge_llamacpp_record(&e->mi, id, &e->rec);
    if (rc != KVEDGE_OK)
        s_why(why, why_len, "model id '%s' does not fit %s: %s", id, path, kvedge_strerror(rc));
    return rc;
}

int kvedge_llamacpp_engine_open(const char *gguf_path, const kvedge_llamacpp_engine_opts_t *o,
                                kvedge_llamacpp_engine_t **out, char *why, size_t why_len)
{
    s_clear_why(why, why_len);
    if (out)
        *out = NULL;
    if (!gguf_path || !o || !out || o->size != sizeof *o || !o->model_id || !o->model_id[0]) {
        s_why(why, why_len,
              "a GGUF path, options of this library's size and a model id are required");
        return KVEDGE_EINVAL;
    }
    int rc = kvedge_llamacpp_version_check(why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    const uint32_t n_ctx = o->n_ctx ? o->n_ctx : KVEDGE_LLAMACPP_N_CTX_DEFAULT;
    const uint32_t n_seq = o->n_seq ? o->n_seq : 1;
    struct llama_context_params cp;
    if (kvedge_llamacpp_context_params(n_ctx, n_seq, o->threads, o->cache, &cp) != KVEDGE_OK) {
        s_why(why, why_len,
              "a context of %u sequences of %u positions with cache type %d: llama.cpp's "
              "context takes at most %u positions, a cache type KVEDGE_LLAMACPP_F16 or _F32",
              n_seq, n_ctx, o->cache, KVEDGE_LLAMACPP_MAX_CELLS);
        return KVEDGE_EINVAL;
    }
    kvedge_llamacpp_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return KVEDGE_ENOMEM;
    kvedge_llamacpp_backend_init();
    rc = s_load(e, gguf_path, o->model_id, why, why_len);
    if (rc == KVEDGE_OK)
        rc = kvedge_llamacpp_layout(&e->mi, &cp, &e->layout, why, why_len);
    if (rc == KVEDGE_OK) {
        e->ctx = llama_init_from_model(e->model, cp);
        if (!e->ctx) {
            s_why(why, why_len, "llama.cpp cannot make a context of %u positions", cp.n_ctx);
            rc = KVEDGE_ENOMEM;
        }
    }
    if (rc != KVEDGE_OK) {
        kvedge_llamacpp_engine_destroy(&e);
        return rc;
    }
    e->n_ctx = llama_n_ctx_seq(e->ctx);
    e->n_seq = llama_n_seq_max(e->ctx);
    *out = e;
    return KVEDGE_OK;
}

void kvedge_llamacpp_engine_destroy(kvedge_llamacpp_engine_t **e)
{
    if (!e || !*e)
        return;
    if ((*e)->ctx)
        llama_free((*e)->ctx);
    if ((*e)->model)
        llama_model_free((*e)->model);
    free(*e);
    *e = NULL;
}

const kvedge_model_t *kvedge_llamacpp_engine_model(const kvedge_llamacpp_engine_t *e)
{
    return e ? &e->rec : NULL;
}

const char *kvedge_llamacpp_engine_arch(const kvedge_llamacpp_engine_t *e)
{
    return e ? e->mi.arch : NULL;
}

uint32_t kvedge_llamacpp_engine_vocab(const kvedge_llamacpp_engine_t *e)
{
    return e ? e->vocab : 0;
}

uint32_t kvedge_llamacpp_engine_n_ctx(const kvedge_llamacpp_engine_t *e)
{
    return e ? e->n_ctx : 0;
}

void *kvedge_llamacpp_engine_context(kvedge_llamacpp_engine_t *e)
{
    return e ? e->ctx : NULL;
}

int kvedge_llamacpp_engine_tokenize(const kvedge_llamacpp_engine_t *e, const char *text, size_t len,
                                    bool add_special, bool parse_special, int32_t *out, size_t cap,
                                    size_t *n)
{
    if (!e)
        return KVEDGE_EINVAL;
    return kvedge_llamacpp_tokenize(e->model, text, len, add_special, parse_special, out, cap, n);
}

int kvedge_llamacpp_engine_detokenize(const kvedge_llamacpp_engine_t *e, const int32_t *tokens,
                                      uint32_t n, bool special, char *out, size_t cap, size_t *len)
{
    if (!e || (!tokens && n) || (!out && cap) || !len || n > INT32_MAX)
        return KVEDGE_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= e->vocab)
            return KVEDGE_EINVAL;
    int32_t max = cap > INT32_MAX ? INT32_MAX : (int32_t)cap;
    int32_t got = llama_detokenize(llama_model_get_vocab(e->model), tokens, (int32_t)n, out, max,
                                   false, special);
    if (got < 0) {
        *len = (size_t) - (int64_t)got;
        return KVEDGE_ENOSPACE;
    }
    *len = (size_t)got;
    return KVEDGE_OK;
}

int kvedge_llamacpp_engine_check(const kvedge_llamacpp_engine_t *e, const kvedge_model_t *m,
                                 char *why, size_t why_len)
{
    s_clear_why(why, why_len);
    if (!e || !m)
        return KVEDGE_EINVAL;
    return kvedge_llamacpp_check(&e->mi, m, why, why_len);
}

static bool s_seq_ok(const kvedge_llamacpp_engine_t *e, int32_t seq, char *why, size_t why_len)
{
    if (seq >= 0 && (uint32_t)seq < e->n_seq)
        return true;
    s_why(why, why_len, "sequence %d: the engine has %u", seq, e->n_seq);
    return false;
}

int kvedge_llamacpp_engine_pos(kvedge_llamacpp_engine_t *e, int32_t seq, int32_t *pos)
{
    if (!e || !pos || !s_seq_ok(e, seq, NULL, 0))
        return KVEDGE_EINVAL;
    *pos = llama_memory_seq_pos_max(llama_get_memory(e->ctx), seq) + 1;
    return KVEDGE_OK;
}

int kvedge_llamacpp_engine_clear(kvedge_llamacpp_engine_t *e, int32_t seq)
{
    if (!e || !s_seq_ok(e, seq, NULL, 0))
        return KVEDGE_EINVAL;
    llama_memory_seq_rm(llama_get_memory(e->ctx), seq, -1, -1);
    return KVEDGE_OK;
}

/* Checks n tokens for seq at its next positions: ids in the vocabulary, room for them and
 * extra positions after. *pos gets the first one. */
static int s_tokens_ok(kvedge_llamacpp_engine_t *e, int32_t seq, const int32_t *tokens, uint32_t n,
                       uint32_t extra, int32_t *pos, char *why, size_t why_len)
{
    if (!tokens || n == 0) {
        s_why(why, why_len, "no tokens");
        return KVEDGE_EINVAL;
    }
    if (!s_seq_ok(e, seq, why, why_len))
        return KVEDGE_EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= e->vocab) {
            s_why(why, why_len, "token %u is %d: the vocabulary has ids 0..%u", i, tokens[i],
                  e->vocab - 1);
            return KVEDGE_EINVAL;
        }
    }
    kvedge_llamacpp_engine_pos(e, seq, pos);
    if ((uint64_t)*pos + n + extra > e->n_ctx) {
        s_why(why, why_len, "sequence %d holds %d positions: %u more do not fit n_ctx %u", seq,
              *pos, n + extra, e->n_ctx);
        return KVEDGE_ETOOBIG;
    }
    return KVEDGE_OK;
}

int kvedge_llamacpp_engine_prefill(kvedge_llamacpp_engine_t *e, int32_t seq, const int32_t *tokens,
                                   uint32_t n, char *why, size_t why_len)
{
    s_clear_why(why, why_len);
    if (!e)
        return KVEDGE_EINVAL;
    int32_t pos = 0;
    int rc = s_tokens_ok(e, seq, tokens, n, 0, &pos, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    rc = kvedge_llamacpp_prefill(e->ctx, seq, tokens, n, pos);
    if (rc != KVEDGE_OK)
        s_why(why, why_len, "llama.cpp's prefill failed");
    return rc;
}

int kvedge_llamacpp_engine_import(kvedge_llamacpp_engine_t *e, int32_t seq,
                                  const kvedge_llamacpp_import_t *req,
                                  kvedge_llamacpp_import_stats_t *stats, char *why, size_t why_len)
{
    s_clear_why(why, why_len);
    if (!e || !req || req->size != sizeof *req)
        return KVEDGE_EINVAL;
    kvedge_llamacpp_import_t r = *req;
    if (!r.model)
        r.model = &e->rec;
    return kvedge_llamacpp_import(e->ctx, seq, &e->mi, &e->layout, &r, stats, why, why_len);
}

void kvedge_llamacpp_export_default(kvedge_llamacpp_export_t *req)
{
    if (!req)
        return;
    memset(req, 0, sizeof *req);
    req->size = sizeof *req;
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    req->scheme = q.scheme;
    req->dtype = q.dtype;
    req->group_size = q.group_size;
    req->compress = q.compress;
    req->pin = q.pin;
    req->ttl_s = q.ttl_s;
}

int kvedge_llamacpp_engine_export(kvedge_llamacpp_engine_t *e, int32_t seq,
                                  const kvedge_llamacpp_export_t *req, kvedge_chunk_id_t *ids,
                                  size_t max, kvedge_llamacpp_export_stats_t *stats, char *why,
                                  size_t why_len)
{
    s_clear_why(why, why_len);
    if (!e || !req || req->size != sizeof *req)
        return KVEDGE_EINVAL;
    if (req->scheme != KVEDGE_SCHEME_LOSSLESS && req->scheme != KVEDGE_SCHEME_INT8 &&
        req->scheme != KVEDGE_SCHEME_INT4) {
        s_why(why, why_len, "scheme %d: lossless, int8 or int4", (int)req->scheme);
        return KVEDGE_EINVAL;
    }
    if (req->dtype != KVEDGE_DTYPE_FP16 && req->dtype != KVEDGE_DTYPE_FP32) {
        s_why(why, why_len, "dtype %d: fp16 or fp32", (int)req->dtype);
        return KVEDGE_EINVAL;
    }
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    q.scheme = req->scheme;
    q.dtype = req->dtype;
    q.group_size = req->group_size;
    q.compress = req->compress;
    q.pin = req->pin;
    q.ttl_s = req->ttl_s;
    return kvedge_llamacpp_export(e->ctx, seq, &e->mi, &e->layout, req->cloud,
                                  req->model ? req->model : &e->rec, req->ctx, req->n,
                                  req->chunk_tokens, &q, ids, max, stats, why, why_len);
}

int kvedge_llamacpp_engine_generate(kvedge_llamacpp_engine_t *e, int32_t seq, const int32_t *prompt,
                                    uint32_t n_prompt, uint32_t max_new, int32_t *gen,
                                    double *ttft_us, char *why, size_t why_len)
{
    s_clear_why(why, why_len);
    if (ttft_us)
        *ttft_us = 0;
    if (!e || !gen || max_new == 0)
        return KVEDGE_EINVAL;
    int32_t pos = 0;
    /* The last generated token is not decoded: it takes no position. */
    int rc = s_tokens_ok(e, seq, prompt, n_prompt, max_new - 1, &pos, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    double first_us = 0;
    const double t0 = s_now_us();
    rc = kvedge_llamacpp_prefill(e->ctx, seq, prompt, n_prompt, pos);
    if (rc != KVEDGE_OK) {
        s_why(why, why_len, "llama.cpp's decode of the prompt failed");
        return rc;
    }
    const double t1 = s_now_us();
    rc = kvedge_llamacpp_generate(e->ctx, seq, pos + (int32_t)n_prompt, max_new, gen, &first_us);
    if (rc != KVEDGE_OK)
        s_why(why, why_len, "llama.cpp's decode of the generated tokens failed");
    if (ttft_us && rc == KVEDGE_OK)
        *ttft_us = t1 - t0 + first_us;
    return rc;
}
