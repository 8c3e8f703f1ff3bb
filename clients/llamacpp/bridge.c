/* The llama.cpp bridge (bridge.h): model check, import into and export from a llama.cpp
 * sequence. */
#define _GNU_SOURCE
#include "clients/llamacpp/bridge.h"

#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ggml-backend.h>
#include <gguf.h>

#include "access/codec/error.h"
#include "access/codec/model.h"
#include "clients/lib/pipeline.h"

/* Relative difference allowed between kvedge's rotary frequencies (fp32) and llama.cpp's. */
#define S_ROPE_REL_TOL 1e-5

static uint64_t s_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static double s_since(uint64_t t0)
{
    return (double)(s_now_us() - t0);
}

static void s_why(char *why, size_t len, const char *fmt, ...)
{
    if (!why || len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

int kvedge_llamacpp_version_check(char *why, size_t why_len)
{
    const char *v = llama_version();
    if (!v || strcmp(v, KVEDGE_LLAMACPP_VERSION) != 0) {
        s_why(why, why_len,
              "llama.cpp %s: the bridge knows the state layout of %s (@node-llama-cpp/linux-x64 "
              "%s) only",
              v ? v : "(unknown)", KVEDGE_LLAMACPP_VERSION, KVEDGE_LLAMACPP_PINNED);
        return KVEDGE_EVERSION;
    }
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- the model */

/* A metadata value of model as a number; dflt when the key is absent. */
static double s_meta(const struct llama_model *model, const char *arch, const char *key,
                     double dflt, bool *found)
{
    char k[128], buf[64];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (llama_model_meta_val_str(model, k, buf, sizeof buf) < 0) {
        if (found)
            *found = false;
        return dflt;
    }
    if (found)
        *found = true;
    return strtod(buf, NULL);
}

/* The rope_freqs tensor (Llama 3's per-pair frequency divisors) of the GGUF at path: 0 and
 * *have false when it has none; KVEDGE_EIO / KVEDGE_ESHAPE. */
static int s_rope_freqs(const char *path, uint32_t pairs, float *f, bool *have, char *why,
                        size_t why_len)
{
    *have = false;
    struct gguf_init_params gp = {.no_alloc = true, .ctx = NULL};
    struct gguf_context *g = gguf_init_from_file(path, gp);
    if (!g) {
        s_why(why, why_len, "%s: not a GGUF file llama.cpp can read", path);
        return KVEDGE_EIO;
    }
    int rc = KVEDGE_OK;
    int64_t t = gguf_find_tensor(g, "rope_freqs.weight");
    if (t >= 0) {
        if (gguf_get_tensor_type(g, t) != GGML_TYPE_F32 ||
            gguf_get_tensor_size(g, t) != (size_t)pairs * sizeof(float)) {
            s_why(why, why_len, "%s: rope_freqs is not %u fp32 values", path, pairs);
            rc = KVEDGE_ESHAPE;
        } else {
            FILE *fp = fopen(path, "rb");
            long off = (long)(gguf_get_data_offset(g) + gguf_get_tensor_offset(g, t));
            if (!fp || fseek(fp, off, SEEK_SET) != 0 ||
                fread(f, sizeof(float), pairs, fp) != pairs) {
                s_why(why, why_len, "%s: cannot read its rope_freqs tensor", path);
                rc = KVEDGE_EIO;
            } else {
                *have = true;
            }
            if (fp)
                fclose(fp);
        }
    }
    gguf_free(g);
    return rc;
}

/* Whether r gives llama.cpp's frequencies theta^(-2i/d) / ff[i] (ff NULL: all 1). */
static bool s_rope_matches(const kvedge_decoder_rope_t *r, uint32_t hd, double theta,
                           const float *ff)
{
    float inv[KVEDGE_LLAMACPP_MAX_HEAD_DIM / 2];
    if (kvedge_decoder_rope_freqs(r, hd, inv) != KVEDGE_OK)
        return false;
    for (uint32_t i = 0; i < hd / 2; i++) {
        double want = pow(theta, -2.0 * i / hd) / (ff ? ff[i] : 1.0);
        if (fabs(inv[i] - want) > S_ROPE_REL_TOL * want)
            return false;
    }
    return true;
}

/* Llama 3's rope_scaling from llama.cpp's divisors: factor is the largest; low_freq_factor 1
 * and high_freq_factor 4 (every Llama 3.x release) and original_max from a divisor in the
 * blended band (8192 when none is). The caller checks the result gives the same frequencies. */
static void s_llama3_guess(double theta, uint32_t hd, const float *ff, kvedge_decoder_rope_t *r)
{
    memset(r, 0, sizeof *r);
    r->rotary = true;
    r->theta = theta;
    r->llama3 = true;
    r->low_freq_factor = 1.0;
    r->high_freq_factor = 4.0;
    r->original_max = 8192.0;
    double factor = 1.0;
    for (uint32_t i = 0; i < hd / 2; i++)
        factor = ff[i] > factor ? ff[i] : factor;
    r->factor = factor;
    for (uint32_t i = 0; i < hd / 2; i++) {
        if (ff[i] > 1.0f + 1e-6f && ff[i] < factor * (1.0 - 1e-6)) {
            double wl = 2.0 * M_PI * pow(theta, 2.0 * i / hd);
            double sm = (1.0 / ff[i] - 1.0 / factor) / (1.0 - 1.0 / factor);
            r->original_max = round(wl * (sm * (r->high_freq_factor - 1.0) + 1.0));
            break;
        }
    }
}

int kvedge_llamacpp_model_info(const struct llama_model *model, const char *gguf_path,
                               const kvedge_decoder_rope_t *hint, kvedge_llamacpp_model_t *out,
                               char *why, size_t why_len)
{
    if (!model || !gguf_path || !out)
        return KVEDGE_EINVAL;
    kvedge_llamacpp_model_t mi;
    memset(&mi, 0, sizeof mi);
    if (llama_model_meta_val_str(model, "general.architecture", mi.arch, sizeof mi.arch) < 0 ||
        (strcmp(mi.arch, "llama") != 0 && strcmp(mi.arch, "qwen2") != 0)) {
        s_why(why, why_len, "%s: architecture '%s': the bridge knows llama and qwen2", gguf_path,
              mi.arch);
        return KVEDGE_ESHAPE;
    }
    mi.permuted = strcmp(mi.arch, "llama") == 0;
    int32_t layers = llama_model_n_layer(model), heads = llama_model_n_head(model),
            kvh = llama_model_n_head_kv(model), embd = llama_model_n_embd(model);
    if (layers <= 0 || heads <= 0 || kvh <= 0 || layers > KVEDGE_LLAMACPP_MAX_LAYERS ||
        kvh > 1024) {
        s_why(why, why_len, "%s: %d layers, %d KV heads: outside the bridge's limits", gguf_path,
              layers, kvh);
        return KVEDGE_ESHAPE;
    }
    double kl = s_meta(model, mi.arch, "attention.key_length", (double)embd / heads, NULL);
    double vl = s_meta(model, mi.arch, "attention.value_length", kl, NULL);
    double rd = s_meta(model, mi.arch, "rope.dimension_count", kl, NULL);
    if (kl != vl || rd != kl || kl < 2 || kl > KVEDGE_LLAMACPP_MAX_HEAD_DIM || (int)kl % 2) {
        s_why(why, why_len,
              "%s: key length %g, value length %g, rotary dimensions %g: the bridge needs them "
              "equal and even (at most %d)",
              gguf_path, kl, vl, rd, KVEDGE_LLAMACPP_MAX_HEAD_DIM);
        return KVEDGE_ESHAPE;
    }
    mi.layers = (uint32_t)layers;
    mi.kv_heads = (uint32_t)kvh;
    mi.head_dim = (uint32_t)kl;
    /* Rotary settings the bridge cannot state as kvedge's: linear / YaRN scaling. */
    char st[32] = "";
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", mi.arch);
    if (llama_model_meta_val_str(model, key, st, sizeof st) >= 0 && strcmp(st, "none") != 0) {
        s_why(why, why_len, "%s: rope scaling '%s': the bridge knows none and Llama 3's", gguf_path,
              st);
        return KVEDGE_ESHAPE;
    }
    if (fabs(llama_model_rope_freq_scale_train(model) - 1.0f) > 1e-6f) {
        s_why(why, why_len, "%s: rope freq_scale %g: the bridge knows 1 only", gguf_path,
              (double)llama_model_rope_freq_scale_train(model));
        return KVEDGE_ESHAPE;
    }
    const double theta = s_meta(model, mi.arch, "rope.freq_base", 10000.0, NULL);
    float ff[KVEDGE_LLAMACPP_MAX_HEAD_DIM / 2];
    bool have = false;
    int rc = s_rope_freqs(gguf_path, mi.head_dim / 2, ff, &have, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    kvedge_decoder_rope_t r;
    if (hint) {
        r = *hint;
    } else if (have) {
        s_llama3_guess(theta, mi.head_dim, ff, &r);
    } else {
        memset(&r, 0, sizeof r);
        r.rotary = true;
        r.theta = theta;
    }
    if (!s_rope_matches(&r, mi.head_dim, theta, have ? ff : NULL)) {
        s_why(why, why_len, "%s: %s do not give llama.cpp's rotary frequencies (freq_base %g%s)%s",
              gguf_path, hint ? "the given rotary settings" : "the rotary settings read from it",
              theta, have ? ", rope_freqs" : "",
              hint ? "" : ": give the model's own (its config.json's rope_scaling)");
        return KVEDGE_ESHAPE;
    }
    mi.rope = r;
    mi.rope_fingerprint = kvedge_decoder_rope_fingerprint_of(&r, mi.head_dim);
    *out = mi;
    return KVEDGE_OK;
}

int kvedge_llamacpp_record(const kvedge_llamacpp_model_t *mi, const char *id, kvedge_model_t *out)
{
    if (!mi || !id || !out || id[0] == '\0' || strlen(id) > KVEDGE_MODEL_ID_MAX_BYTES)
        return KVEDGE_EINVAL;
    if (mi->layers > KVEDGE_MODEL_MAX_LAYERS || mi->kv_heads > KVEDGE_MODEL_MAX_HEADS ||
        mi->head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM)
        return KVEDGE_ETOOBIG;
    kvedge_model_t m;
    memset(&m, 0, sizeof m);
    const size_t len = strlen(id);
    memcpy(m.id, id, len + 1);
    uint32_t has = kvedge_model_id_rope(id), f = mi->rope_fingerprint;
    if (has && has != f)
        return KVEDGE_ESHAPE;
    if (f && !has) {
        if (len + KVEDGE_MODEL_ROPE_SUFFIX_BYTES > KVEDGE_MODEL_ID_MAX_BYTES)
            return KVEDGE_EINVAL;
        snprintf(m.id + len, KVEDGE_MODEL_ROPE_SUFFIX_BYTES + 1, "@rope-%08x", f);
    }
    m.layers = (uint16_t)mi->layers;
    m.kv_heads = (uint16_t)mi->kv_heads;
    m.head_dim = (uint16_t)mi->head_dim;
    m.dtype = KVEDGE_DTYPE_FP16;
    int rc = kvedge_model_check(&m);
    if (rc == KVEDGE_OK)
        *out = m;
    return rc;
}

int kvedge_llamacpp_check(const kvedge_llamacpp_model_t *mi, const kvedge_model_t *m, char *why,
                          size_t why_len)
{
    if (!mi || !m)
        return KVEDGE_EINVAL;
    if (kvedge_model_check(m) != KVEDGE_OK) {
        s_why(why, why_len, "model record %s is not a valid shape", m->id);
        return KVEDGE_ESHAPE;
    }
    if (m->layers != mi->layers) {
        s_why(why, why_len, "layers: GGUF %u, model record %s %u", mi->layers, m->id, m->layers);
        return KVEDGE_ESHAPE;
    }
    if (m->kv_heads != mi->kv_heads) {
        s_why(why, why_len, "KV heads: GGUF %u, model record %s %u", mi->kv_heads, m->id,
              m->kv_heads);
        return KVEDGE_ESHAPE;
    }
    if (m->head_dim != mi->head_dim) {
        s_why(why, why_len, "head dim: GGUF %u, model record %s %u", mi->head_dim, m->id,
              m->head_dim);
        return KVEDGE_ESHAPE;
    }
    uint32_t f = kvedge_model_id_rope(m->id);
    if (f != mi->rope_fingerprint) {
        s_why(why, why_len, "rotary settings: the GGUF's are @rope-%08x, model record %s %s",
              mi->rope_fingerprint, m->id, f ? "names other ones" : "has none (learned positions)");
        return KVEDGE_ESHAPE;
    }
    return KVEDGE_OK;
}

int kvedge_llamacpp_layout(const kvedge_llamacpp_model_t *mi, const struct llama_context_params *cp,
                           kvedge_llamacpp_layout_t *out, char *why, size_t why_len)
{
    if (!mi || !cp || !out)
        return KVEDGE_EINVAL;
    if (cp->type_k != cp->type_v || (cp->type_k != GGML_TYPE_F32 && cp->type_k != GGML_TYPE_F16)) {
        s_why(why, why_len,
              "cache type K %s, V %s: the bridge writes F16 and F32 caches (K and V alike)",
              ggml_type_name(cp->type_k), ggml_type_name(cp->type_v));
        return KVEDGE_EINVAL;
    }
    if (cp->flash_attn_type == LLAMA_FLASH_ATTN_TYPE_AUTO) {
        s_why(why, why_len,
              "flash_attn_type AUTO: llama.cpp decides it inside the context, and with it "
              "whether V is kept transposed; state ENABLED or DISABLED");
        return KVEDGE_EINVAL;
    }
    kvedge_llamacpp_layout_t l = {
        .layers = mi->layers,
        .kv_heads = mi->kv_heads,
        .head_dim = mi->head_dim,
        .permuted = mi->permuted,
        .type = cp->type_k == GGML_TYPE_F32 ? KVEDGE_LLAMACPP_F32 : KVEDGE_LLAMACPP_F16,
        .v_trans = cp->flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED,
        .n_stream = cp->kv_unified || cp->n_seq_max <= 1 ? 1 : cp->n_seq_max,
    };
    int rc = kvedge_llamacpp_layout_check(&l);
    if (rc != KVEDGE_OK) {
        s_why(why, why_len, "a cache layout the bridge does not write");
        return rc;
    }
    *out = l;
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- prefill */

int kvedge_llamacpp_prefill(struct llama_context *ctx, int32_t seq, const int32_t *tokens,
                            uint32_t n, int32_t pos0)
{
    if (!ctx || !tokens || n == 0 || seq < 0 || pos0 < 0 || (uint64_t)pos0 + n > INT32_MAX)
        return KVEDGE_EINVAL;
    uint32_t nb = llama_n_batch(ctx);
    if (nb == 0)
        return KVEDGE_EINVAL;
    struct llama_batch b = llama_batch_init((int32_t)nb, 0, 1);
    if (!b.token)
        return KVEDGE_ENOMEM;
    int rc = KVEDGE_OK;
    for (uint32_t at = 0; at < n && rc == KVEDGE_OK; at += nb) {
        uint32_t m = n - at < nb ? n - at : nb;
        for (uint32_t i = 0; i < m; i++) {
            b.token[i] = tokens[at + i];
            b.pos[i] = pos0 + (int32_t)(at + i);
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = seq;
            b.logits[i] = at + i == n - 1;
        }
        b.n_tokens = (int32_t)m;
        if (llama_decode(ctx, b) != 0)
            rc = KVEDGE_EIO;
    }
    llama_batch_free(b);
    return rc;
}

/* ---------------------------------------------------------------- setup and generation */

static void s_log_errors(enum ggml_log_level level, const char *text, void *arg)
{
    (void)arg;
    if (level == GGML_LOG_LEVEL_ERROR)
        fprintf(stderr, "llama.cpp: %s", text);
}

static void s_backend_init_once(void)
{
    llama_log_set(s_log_errors, NULL);
    Dl_info info;
    char dir[PATH_MAX];
    if (dladdr((void *)llama_backend_init, &info) && info.dli_fname &&
        strlen(info.dli_fname) < sizeof dir) {
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = '\0';
            ggml_backend_load_all_from_path(dir);
        }
    }
    if (ggml_backend_dev_count() == 0)
        ggml_backend_load_all();
    llama_backend_init();
}

void kvedge_llamacpp_backend_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, s_backend_init_once);
}

int kvedge_llamacpp_context_params(uint32_t n_cells, uint32_t n_seq, uint32_t threads, int type,
                                   struct llama_context_params *out)
{
    n_seq = n_seq ? n_seq : 1;
    if (!out || n_cells == 0 || (uint64_t)n_cells * n_seq > KVEDGE_LLAMACPP_MAX_CELLS ||
        n_seq > KVEDGE_LLAMACPP_MAX_STREAMS || threads > INT32_MAX ||
        (type != KVEDGE_LLAMACPP_F32 && type != KVEDGE_LLAMACPP_F16))
        return KVEDGE_EINVAL;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_cells * n_seq;
    cp.n_batch = cp.n_ubatch = n_cells < 512 ? n_cells : 512;
    cp.n_seq_max = n_seq;
    cp.kv_unified = false;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int32_t dflt = cpus < 1 ? 1
                   : cpus > KVEDGE_LLAMACPP_THREADS_MAX_DEFAULT
                       ? KVEDGE_LLAMACPP_THREADS_MAX_DEFAULT
                       : (int32_t)cpus;
    cp.n_threads = cp.n_threads_batch = threads ? (int32_t)threads : dflt;
    cp.type_k = cp.type_v = type == KVEDGE_LLAMACPP_F32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    *out = cp;
    return KVEDGE_OK;
}

int kvedge_llamacpp_tokenize(const struct llama_model *model, const char *text, size_t len,
                             bool add_special, bool parse_special, int32_t *out, size_t cap,
                             size_t *n)
{
    if (!model || (!text && len) || !n || (!out && cap) || len > INT32_MAX / 2)
        return KVEDGE_EINVAL;
    const struct llama_vocab *v = llama_model_get_vocab(model);
    int32_t max = cap > INT32_MAX ? INT32_MAX : (int32_t)cap;
    int32_t got =
        llama_tokenize(v, text ? text : "", (int32_t)len, out, max, add_special, parse_special);
    if (got == INT32_MIN)
        return KVEDGE_EINVAL;
    if (got < 0) {
        *n = (size_t) - (int64_t)got;
        return KVEDGE_ENOSPACE;
    }
    *n = (size_t)got;
    return KVEDGE_OK;
}

int kvedge_llamacpp_generate(struct llama_context *ctx, int32_t seq, int32_t pos, uint32_t max_new,
                             int32_t *gen, double *first_us)
{
    if (first_us)
        *first_us = 0;
    if (!ctx || seq < 0 || pos < 0 || (max_new && !gen) || (uint64_t)pos + max_new > INT32_MAX)
        return KVEDGE_EINVAL;
    const uint64_t t0 = s_now_us();
    const int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(ctx)));
    struct llama_batch b = llama_batch_init(1, 0, 1);
    if (!b.token)
        return KVEDGE_ENOMEM;
    int rc = KVEDGE_OK;
    for (uint32_t g = 0; g < max_new; g++) {
        const float *logits = llama_get_logits_ith(ctx, -1);
        if (!logits) { /* nothing decoded yet */
            rc = KVEDGE_EINVAL;
            break;
        }
        gen[g] = kvedge_decoder_argmax(logits, (uint32_t)vocab);
        if (g == 0 && first_us)
            *first_us = s_since(t0);
        if (g + 1 == max_new)
            break;
        b.token[0] = gen[g];
        b.pos[0] = pos + (int32_t)g;
        b.n_seq_id[0] = 1;
        b.seq_id[0][0] = seq;
        b.logits[0] = 1;
        b.n_tokens = 1;
        if (llama_decode(ctx, b) != 0) {
            rc = KVEDGE_EIO;
            break;
        }
    }
    llama_batch_free(b);
    return rc;
}

/* ---------------------------------------------------------------- import */

void kvedge_llamacpp_import_default(kvedge_llamacpp_import_t *req)
{
    if (!req)
        return;
    memset(req, 0, sizeof *req);
    req->size = sizeof *req;
    req->compute_misses = true;
}

/* What seq held before an import, to put back on any error. */
typedef struct {
    uint8_t *buf;
    size_t len;
    bool empty;
} s_saved_t;

static int s_save(struct llama_context *ctx, int32_t seq, const kvedge_llamacpp_layout_t *l,
                  s_saved_t *sv, char *why, size_t why_len)
{
    memset(sv, 0, sizeof *sv);
    size_t n = llama_state_seq_get_size(ctx, seq);
    sv->buf = n ? malloc(n) : NULL;
    if (!sv->buf)
        return KVEDGE_ENOMEM;
    sv->len = llama_state_seq_get_data(ctx, sv->buf, n, seq);
    kvedge_llamacpp_state_info_t info;
    int rc = sv->len == n ? kvedge_llamacpp_state_info(sv->buf, sv->len, &info) : KVEDGE_EIO;
    if (rc == KVEDGE_EVERSION || rc == KVEDGE_ECORRUPT) {
        s_why(why, why_len, "llama.cpp's state of sequence %d is not the layout the bridge knows",
              seq);
        return KVEDGE_EVERSION;
    }
    if (rc != KVEDGE_OK)
        return rc;
    if (info.n_stream != l->n_stream) {
        s_why(why, why_len, "the context has %u KV streams, the layout says %u", info.n_stream,
              l->n_stream);
        return KVEDGE_ESHAPE;
    }
    sv->empty = info.cells == 0;
    return KVEDGE_OK;
}

/* Puts seq back as s_save found it. */
static void s_restore(struct llama_context *ctx, int32_t seq, const s_saved_t *sv)
{
    llama_memory_seq_rm(llama_get_memory(ctx), seq, -1, -1);
    if (!sv->empty)
        llama_state_seq_set_data(ctx, sv->buf, sv->len, seq);
}

/* Fetches every layer of the context into k and v (fp32, [layers][kv_heads][n][head_dim]);
 * *missed counts the layers the proxy did not have. */
static int s_fetch(const kvedge_llamacpp_model_t *mi, const kvedge_llamacpp_import_t *req, float *k,
                   float *v, uint32_t *missed)
{
    const uint32_t L = mi->layers, n = req->n, hd = mi->head_dim, kvh = mi->kv_heads;
    const uint32_t ct = req->chunk_tokens ? req->chunk_tokens : KVEDGE_E2E_CHUNK_TOKENS_DEFAULT;
    const size_t max_chunks = ((size_t)n + ct - 1) / ct, kvf = (size_t)kvh * n * hd;
    kvedge_chunk_id_t *ids = malloc(max_chunks * sizeof *ids);
    kvedge_kv_dst_t *kd = calloc(L, sizeof *kd), *vd = calloc(L, sizeof *vd);
    int rc = ids && kd && vd ? KVEDGE_OK : KVEDGE_ENOMEM;
    size_t n_chunks = 0;
    if (rc == KVEDGE_OK)
        rc = kvedge_e2e_chunks(req->model, req->ctx, n, ct, ids, max_chunks, &n_chunks);
    for (uint32_t l = 0; rc == KVEDGE_OK && l < L; l++) {
        kvedge_kv_dst_t t = {.layout = KVEDGE_KV_CONTIG,
                             .dtype = KVEDGE_DTYPE_FP32,
                             .base = k + l * kvf,
                             .cap_bytes = kvf * sizeof(float),
                             .heads = kvh,
                             .head_dim = hd,
                             .tokens_cap = n};
        kd[l] = t;
        t.base = v + l * kvf;
        vd[l] = t;
    }
    kvedge_pipeline_t *pipe = NULL;
    if (rc == KVEDGE_OK) {
        kvedge_pipeline_opts_t o;
        kvedge_pipeline_opts_default(&o);
        o.client = req->proxy;
        o.model = req->model;
        o.chunks = ids;
        o.n_chunks = n_chunks;
        o.chunk_tokens = ct;
        o.tokens = n;
        o.first_layer = 0;
        o.layers = (uint16_t)L;
        o.k = kd;
        o.v = vd;
        o.ring_slots = L < KVEDGE_E2E_RING_DEFAULT ? L : KVEDGE_E2E_RING_DEFAULT;
        o.slot_bytes = kvedge_e2e_slot_bytes(n, ct, kvh, hd);
        o.deadline_ms = req->deadline_ms;
        rc = kvedge_pipeline_open(&o, &pipe);
    }
    *missed = 0;
    for (uint32_t l = 0; rc == KVEDGE_OK && l < L; l++) {
        int w = kvedge_pipeline_wait(pipe, (uint16_t)l);
        if (w == KVEDGE_ENOTFOUND)
            (*missed)++;
        else if (w != KVEDGE_OK)
            rc = w;
    }
    kvedge_pipeline_destroy(&pipe);
    free(vd);
    free(kd);
    free(ids);
    return rc;
}

/* Checks shared by import and export: version, record, layout. */
static int s_checks(struct llama_context *ctx, int32_t seq, const kvedge_llamacpp_model_t *mi,
                    const kvedge_llamacpp_layout_t *l, const kvedge_model_t *m, char *why,
                    size_t why_len)
{
    int rc = kvedge_llamacpp_version_check(why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    rc = kvedge_llamacpp_check(mi, m, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    if (kvedge_llamacpp_layout_check(l) != KVEDGE_OK || l->layers != mi->layers ||
        l->kv_heads != mi->kv_heads || l->head_dim != mi->head_dim || l->permuted != mi->permuted) {
        s_why(why, why_len,
              "the cache layout is not one of this model's, or not one the bridge "
              "writes (F16 / F32)");
        return KVEDGE_ESHAPE;
    }
    if (seq < 0 || (uint32_t)seq >= llama_n_seq_max(ctx)) {
        s_why(why, why_len, "sequence %d: the context has %u", seq, llama_n_seq_max(ctx));
        return KVEDGE_EINVAL;
    }
    return KVEDGE_OK;
}

int kvedge_llamacpp_import(struct llama_context *ctx, int32_t seq,
                           const kvedge_llamacpp_model_t *mi, const kvedge_llamacpp_layout_t *l,
                           const kvedge_llamacpp_import_t *req,
                           kvedge_llamacpp_import_stats_t *stats, char *why, size_t why_len)
{
    kvedge_llamacpp_import_stats_t st;
    memset(&st, 0, sizeof st);
    if (why && why_len)
        why[0] = '\0';
    if (!ctx || !mi || !l || !req || req->size != sizeof *req || !req->proxy || !req->model ||
        !req->ctx || req->n == 0 || req->deadline_ms < 0 ||
        req->chunk_tokens > KVEDGE_BLOCK_MAX_TOKENS)
        return KVEDGE_EINVAL;
    int rc = s_checks(ctx, seq, mi, l, req->model, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    if (req->n > llama_n_ctx_seq(ctx) || req->n > KVEDGE_LLAMACPP_MAX_CELLS) {
        s_why(why, why_len,
              "a %u-token context does not fit the llama.cpp context (n_ctx %u "
              "per sequence)",
              req->n, llama_n_ctx_seq(ctx));
        return KVEDGE_ETOOBIG;
    }
    s_saved_t sv;
    rc = s_save(ctx, seq, l, &sv, why, why_len);
    const size_t f = (size_t)mi->layers * mi->kv_heads * req->n * mi->head_dim;
    float *k = rc == KVEDGE_OK ? malloc(f * sizeof *k) : NULL;
    float *v = rc == KVEDGE_OK ? malloc(f * sizeof *v) : NULL;
    if (rc == KVEDGE_OK && (!k || !v))
        rc = KVEDGE_ENOMEM;
    uint64_t t0 = s_now_us();
    if (rc == KVEDGE_OK) {
        rc = s_fetch(mi, req, k, v, &st.missed);
        st.fetch_us = s_since(t0);
        if (rc != KVEDGE_OK)
            s_why(why, why_len, "fetch: %s", kvedge_strerror(rc));
    }
    st.fetched = rc == KVEDGE_OK ? mi->layers - st.missed : 0;
    uint8_t *blob = NULL;
    bool touched = false; /* seq changed: put back on an error */
    if (rc == KVEDGE_OK && st.missed == 0) {
        t0 = s_now_us();
        size_t cap = kvedge_llamacpp_state_bytes(l, req->n), len = 0;
        blob = malloc(cap);
        rc = blob ? kvedge_llamacpp_state_write(l, seq, 0, req->n, k, v, blob, cap, &len)
                  : KVEDGE_ENOMEM;
        st.convert_us = s_since(t0);
        st.state_bytes = len;
        if (rc == KVEDGE_OK) {
            t0 = s_now_us();
            touched = true;
            size_t got = llama_state_seq_set_data(ctx, blob, len, seq);
            st.load_us = s_since(t0);
            if (got != len) {
                s_why(why, why_len,
                      "llama.cpp refused the state (its log says why): the layout's cache type "
                      "or V layout is not the context's");
                rc = KVEDGE_ESHAPE;
            }
        }
    } else if (rc == KVEDGE_OK && !req->compute_misses) {
        s_why(why, why_len, "%u of %u layers missed; nothing imported", st.missed, mi->layers);
        rc = KVEDGE_ENOTFOUND;
    } else if (rc == KVEDGE_OK) {
        /* The state API takes every layer of a sequence: llama.cpp computes the context. */
        t0 = s_now_us();
        touched = true;
        llama_memory_seq_rm(llama_get_memory(ctx), seq, -1, -1);
        rc = kvedge_llamacpp_prefill(ctx, seq, req->ctx, req->n, 0);
        st.prefill_us = s_since(t0);
        st.prefilled = true;
        if (rc != KVEDGE_OK)
            s_why(why, why_len, "llama.cpp's prefill of the context failed");
    }
    if (rc != KVEDGE_OK && touched)
        s_restore(ctx, seq, &sv);
    free(blob);
    free(v);
    free(k);
    free(sv.buf);
    if (stats)
        *stats = st;
    return rc;
}

/* ---------------------------------------------------------------- export */

int kvedge_llamacpp_export(struct llama_context *ctx, int32_t seq,
                           const kvedge_llamacpp_model_t *mi, const kvedge_llamacpp_layout_t *l,
                           kvedge_client_t *cloud, const kvedge_model_t *m, const int32_t *tokens,
                           uint32_t n, uint32_t chunk_tokens, const kvedge_e2e_quant_t *q,
                           kvedge_chunk_id_t *ids, size_t max,
                           kvedge_llamacpp_export_stats_t *stats, char *why, size_t why_len)
{
    kvedge_llamacpp_export_stats_t st;
    memset(&st, 0, sizeof st);
    if (why && why_len)
        why[0] = '\0';
    if (!ctx || !mi || !l || !cloud || !m || !tokens || n == 0 || !q || !ids ||
        n > KVEDGE_LLAMACPP_MAX_CELLS)
        return KVEDGE_EINVAL;
    int rc = s_checks(ctx, seq, mi, l, m, why, why_len);
    if (rc != KVEDGE_OK)
        return rc;
    uint64_t t0 = s_now_us();
    /* Bounded by what n tokens of this layout take: a sequence holding more is refused below
     * without reading it. */
    size_t size = llama_state_seq_get_size(ctx, seq), cap = kvedge_llamacpp_state_bytes(l, n);
    if (size != cap) {
        s_why(why, why_len,
              "sequence %d's state is %zu bytes, %u tokens of this layout %zu: it does not hold "
              "the %u-token context (or its cache is not the layout's)",
              seq, size, n, cap, n);
        return KVEDGE_ESHAPE;
    }
    uint8_t *blob = malloc(size);
    const size_t f = (size_t)mi->layers * mi->kv_heads * n * mi->head_dim;
    float *k = malloc(f * sizeof *k), *v = malloc(f * sizeof *v);
    rc = blob && k && v ? KVEDGE_OK : KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK && llama_state_seq_get_data(ctx, blob, size, seq) != size)
        rc = KVEDGE_EIO;
    uint32_t got = 0;
    int32_t pos0 = -1;
    if (rc == KVEDGE_OK) {
        rc = kvedge_llamacpp_state_read(l, blob, size, k, v, n, &got, &pos0);
        if (rc == KVEDGE_EVERSION || rc == KVEDGE_ECORRUPT)
            s_why(why, why_len, "llama.cpp's state is not the layout the bridge knows");
        else if (rc != KVEDGE_OK)
            s_why(why, why_len,
                  "sequence %d's state is not the layout's (type, V layout, "
                  "positions)",
                  seq);
    }
    if (rc == KVEDGE_OK && (got != n || pos0 != 0)) {
        s_why(why, why_len, "sequence %d holds %u tokens from position %d, not %u from 0", seq, got,
              pos0, n);
        rc = KVEDGE_ESHAPE;
    }
    st.read_us = s_since(t0);
    st.state_bytes = size;
    if (rc == KVEDGE_OK) {
        rc = kvedge_e2e_prefill_model_kv(cloud, m, tokens, n, chunk_tokens, q, k, v, ids, max,
                                         &st.put);
        if (rc != KVEDGE_OK)
            s_why(why, why_len, "put: %s", kvedge_strerror(rc));
    }
    free(v);
    free(k);
    free(blob);
    if (stats)
        *stats = st;
    return rc;
}
