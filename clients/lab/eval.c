/* The quality of the cache schemes (eval.h): cloud prefill per scheme, edge fetch through the
 * proxy, teacher-forced decoder sessions over the fetched context K/V against a reference
 * that computes the context itself, and the figures per scheme and per layer. */
#include "clients/lab/eval.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clients/e2e/e2e.h"
#include "clients/lib/pipeline.h"
#include "proxy/quality.h"
#include "access/codec/basis.h"
#include "access/codec/block.h"
#include "access/codec/prec.h"

static double s_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void s_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* ---------------------------------------------------------------- schemes */

/* Reads a decimal number in [lo, hi] at *p (advancing it). */
static bool s_num(const char **p, unsigned lo, unsigned hi, unsigned *out)
{
    unsigned v = 0;
    const char *s = *p;
    if (!isdigit((unsigned char)*s))
        return false;
    while (isdigit((unsigned char)*s)) {
        v = v * 10 + (unsigned)(*s++ - '0');
        if (v > hi)
            return false;
    }
    if (v < lo)
        return false;
    *p = s;
    *out = v;
    return true;
}

/* Consumes prefix at *p when it is there. */
static bool s_eat(const char **p, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(*p, prefix, n) != 0)
        return false;
    *p += n;
    return true;
}

int kvedge_eval_scheme_parse(const char *name, kvedge_eval_scheme_t *out)
{
    if (!name || !out)
        return KVEDGE_EINVAL;
    kvedge_eval_scheme_t s;
    memset(&s, 0, sizeof s);
    s.dtype = KVEDGE_DTYPE_FP32;
    s.keep_pct = 100;
    s.goal_pct = -1;
    const char *p = name;
    unsigned v = 0;
    bool think_only = false;
    if (s_eat(&p, "lossless")) {
        s.scheme = KVEDGE_SCHEME_LOSSLESS;
    } else if (s_eat(&p, "fp16")) {
        s.scheme = KVEDGE_SCHEME_LOSSLESS;
        s.dtype = KVEDGE_DTYPE_FP16;
    } else if (s_eat(&p, "int8")) {
        s.scheme = KVEDGE_SCHEME_INT8;
    } else if (s_eat(&p, "int4")) {
        s.scheme = KVEDGE_SCHEME_INT4;
        s.group_size = KVEDGE_BLOCK_INT4_GROUP_DEFAULT;
        if (s_eat(&p, "-g")) {
            if (!s_num(&p, KVEDGE_E2E_GROUP_MIN, KVEDGE_BLOCK_MAX_TOKENS - 1, &v))
                return KVEDGE_EINVAL;
            s.group_size = (uint16_t)v;
        }
    } else if (s_eat(&p, "tc")) {
        s.scheme = KVEDGE_SCHEME_TC;
    } else if (strncmp(p, "think-", 6) == 0) {
        s.scheme = KVEDGE_SCHEME_LOSSLESS;
        think_only = true;
    } else {
        return KVEDGE_EINVAL;
    }
    if (think_only || (strncmp(p, "+ec", 3) != 0 && s_eat(&p, "+"))) {
        if (!s_eat(&p, "think-") || !s_num(&p, 1, 99, &v))
            return KVEDGE_EINVAL;
        s.keep_pct = (uint8_t)v;
    }
    /* +ec: the int8 and int4 rungs the ladder codes (no ThinK here); tc takes neither. */
    if (s_eat(&p, "+ec")) {
        if ((s.scheme != KVEDGE_SCHEME_INT8 && s.scheme != KVEDGE_SCHEME_INT4) || s.keep_pct != 100)
            return KVEDGE_EINVAL;
        s.ec = true;
    }
    if (*p != '\0' || (s.scheme == KVEDGE_SCHEME_TC && s.keep_pct != 100))
        return KVEDGE_EINVAL;
    /* Canonical name: the base, then the ThinK share or +ec. */
    char base[16];
    if (s.scheme == KVEDGE_SCHEME_TC)
        snprintf(base, sizeof base, "tc");
    else if (s.scheme == KVEDGE_SCHEME_INT4)
        snprintf(base, sizeof base, "int4-g%u", (unsigned)s.group_size);
    else if (s.scheme == KVEDGE_SCHEME_INT8)
        snprintf(base, sizeof base, "int8");
    else
        snprintf(base, sizeof base, "%s", s.dtype == KVEDGE_DTYPE_FP16 ? "fp16" : "lossless");
    if (s.keep_pct == 100)
        snprintf(s.name, sizeof s.name, "%s%s", base, s.ec ? "+ec" : "");
    else if (s.scheme == KVEDGE_SCHEME_LOSSLESS && s.dtype == KVEDGE_DTYPE_FP32)
        snprintf(s.name, sizeof s.name, "think-%u", (unsigned)s.keep_pct);
    else
        snprintf(s.name, sizeof s.name, "%s+think-%u", base, (unsigned)s.keep_pct);
    if (s.keep_pct == 100) {
        if (s.scheme == KVEDGE_SCHEME_LOSSLESS && s.dtype == KVEDGE_DTYPE_FP32)
            s.goal_pct = 0;
        else if (s.scheme == KVEDGE_SCHEME_INT8)
            s.goal_pct = KVEDGE_EVAL_GOAL_INT8_PCT;
        else if (s.scheme == KVEDGE_SCHEME_INT4 && s.group_size == 32)
            s.goal_pct = KVEDGE_EVAL_GOAL_INT4_G32_PCT;
    }
    *out = s;
    return KVEDGE_OK;
}

static size_t s_parse_list(const char *const *names, size_t n, kvedge_eval_scheme_t *out,
                           size_t max)
{
    if (!out)
        return n;
    size_t k = 0;
    for (size_t i = 0; i < n && k < max; i++)
        if (kvedge_eval_scheme_parse(names[i], &out[k]) == KVEDGE_OK)
            k++;
    return k;
}

size_t kvedge_eval_schemes_default(kvedge_eval_scheme_t *out, size_t max)
{
    static const char *const names[] = {"lossless", "fp16",     "int8",
                                        "int4-g32", "int4-g64", "int4-g128",
                                        "think-75", "think-50", "int4-g32+think-50"};
    return s_parse_list(names, sizeof names / sizeof *names, out, max);
}

size_t kvedge_eval_profiles_default(kvedge_eval_scheme_t *out, size_t max)
{
    static const char *const names[] = {"int4-g32", "think-50"};
    return s_parse_list(names, sizeof names / sizeof *names, out, max);
}

size_t kvedge_eval_profiles_ladder(kvedge_eval_scheme_t *out, size_t max)
{
    static const char *const names[] = {
        "int8",          "int4-g32",          "int4-g64",          "int4-g128",          "think-75",
        "int8+think-75", "int4-g32+think-75", "int4-g64+think-75", "int4-g128+think-75", "think-50",
        "int8+think-50", "int4-g32+think-50", "int4-g64+think-50", "int4-g128+think-50"};
    return s_parse_list(names, sizeof names / sizeof *names, out, max);
}

int kvedge_eval_scheme_prec(const kvedge_eval_scheme_t *s, kvedge_prec_t *out)
{
    if (!s || !out)
        return KVEDGE_EINVAL;
    unsigned base, think;
    if (s->scheme == KVEDGE_SCHEME_TC) {
        if (s->keep_pct != 100 || s->ec)
            return KVEDGE_EINVAL;
        *out = KVEDGE_PREC_TC;
        return KVEDGE_OK;
    }
    if (s->scheme == KVEDGE_SCHEME_LOSSLESS && s->dtype == KVEDGE_DTYPE_FP32)
        base = KVEDGE_PREC_LOSSLESS;
    else if (s->scheme == KVEDGE_SCHEME_INT8)
        base = KVEDGE_PREC_INT8;
    else if (s->scheme == KVEDGE_SCHEME_INT4 && s->group_size == 32)
        base = KVEDGE_PREC_INT4_G32;
    else if (s->scheme == KVEDGE_SCHEME_INT4 && s->group_size == 64)
        base = KVEDGE_PREC_INT4_G64;
    else if (s->scheme == KVEDGE_SCHEME_INT4 && s->group_size == 128)
        base = KVEDGE_PREC_INT4_G128;
    else
        return KVEDGE_EINVAL;
    if (s->keep_pct == 100)
        think = KVEDGE_PREC_THINK_NONE;
    else if (s->keep_pct == 75)
        think = KVEDGE_PREC_THINK_75;
    else if (s->keep_pct == 50)
        think = KVEDGE_PREC_THINK_50;
    else
        return KVEDGE_EINVAL;
    if (s->ec && (base == KVEDGE_PREC_LOSSLESS || think != KVEDGE_PREC_THINK_NONE))
        return KVEDGE_EINVAL;
    *out = (kvedge_prec_t)(KVEDGE_PREC_MAKE(base, think) | (s->ec ? KVEDGE_PREC_EC : 0u));
    return KVEDGE_OK;
}

uint32_t kvedge_eval_keep_channels(uint8_t keep_pct, uint32_t head_dim)
{
    if (keep_pct == 0 || keep_pct >= 100)
        return head_dim;
    return kvedge_prec_keep_share(keep_pct, head_dim);
}

int kvedge_eval_model(const kvedge_model_t *m, const kvedge_eval_scheme_t *s, kvedge_model_t *out)
{
    if (!m || !s || !out || m->id[0] == '\0' || s->name[0] == '\0')
        return KVEDGE_EINVAL;
    size_t a = strnlen(m->id, sizeof m->id), b = strnlen(s->name, sizeof s->name);
    if (a + 1 + b > KVEDGE_MODEL_ID_MAX_BYTES)
        return KVEDGE_ETOOBIG;
    /* A rotary model's fingerprint stays last ("base@int8@rope-XXXXXXXX"): it is where the
     * store and the decoder read it. */
    size_t rope = kvedge_model_id_rope(m->id) ? KVEDGE_MODEL_ROPE_SUFFIX_BYTES : 0;
    kvedge_model_t r = *m;
    memset(r.id, 0, sizeof r.id);
    memcpy(r.id, m->id, a - rope);
    r.id[a - rope] = '@';
    memcpy(r.id + a - rope + 1, s->name, b);
    memcpy(r.id + a - rope + 1 + b, m->id + a - rope, rope);
    *out = r;
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- accumulators */

typedef struct {
    double nll, kl; /* sums over positions */
    uint64_t n, agree;
    double max_diff;
    uint64_t bytes, fp16_bytes;
} s_acc_t;

/* A scheme as stored for one document: its model record and where its fetched K/V lives. */
typedef struct {
    kvedge_eval_scheme_t s;
    kvedge_model_t model;
    int row;      /* index in the result's scheme rows, or -1 */
    bool keep;    /* its K/V is read after the next scheme's fetch (lossless, profiles) */
    float *k, *v; /* [layers][kv_heads][ctx][head_dim]; owned when keep, else the scratch */
    kvedge_e2e_quant_t q;
} s_stored_t;

typedef struct {
    const kvedge_eval_opts_t *o;
    const kvedge_decoder_config_t *c;
    uint32_t K, M, ct;
    size_t kvf; /* floats of one layer of K (or V) of the context */
    kvedge_decoder_session_t *sess;
    float *ref;       /* [M][vocab]: reference logits of the current document */
    double *ref_lse;  /* [M] */
    int32_t *ref_arg; /* [M] */
    float *cur;       /* [vocab] */
    float *scratch_k, *scratch_v;
    s_stored_t st[KVEDGE_EVAL_MAX_SCHEMES + KVEDGE_EVAL_MAX_PROFILES + 1];
    size_t n_st;
    size_t lossless; /* index in st of the fp32 lossless copy (profiles), or SIZE_MAX */
    size_t prof[KVEDGE_EVAL_MAX_PROFILES]; /* index in st of each profile scheme */
    s_acc_t ref_acc, row_acc[KVEDGE_EVAL_MAX_SCHEMES];
    s_acc_t *prof_acc[KVEDGE_EVAL_MAX_PROFILES]; /* [layers] each */
    kvedge_chunk_id_t *ids;
    size_t max_ids;
    const float **lk, **lv; /* [layers]: a provider's source per layer */
    /* Schemes coded here (s_local): the context's K/V of the current document, computed once
     * ([layers][kv_heads][ctx][head_dim] fp32, NULL when no scheme needs it), and tc's basis. */
    float *src_k, *src_v;
    bool have_src;
    const kvedge_basis_t *basis;
} s_eval_t;

/* Position i of a document: the reference's log-softmax is ref[i] - ref_lse[i]. */
static void s_score(s_eval_t *e, uint32_t i, const float *x, int32_t target, s_acc_t *a)
{
    const uint32_t V = e->c->vocab;
    int32_t arg;
    double lse = kvedge_eval_lse(x, V, &arg);
    a->nll += lse - x[target];
    a->n++;
    const float *r = e->ref + (size_t)i * V;
    double rl = e->ref_lse[i], kl = 0, md = a->max_diff;
    for (uint32_t t = 0; t < V; t++) {
        double lr = (double)r[t] - rl, lq = (double)x[t] - lse;
        kl += exp(lr) * (lr - lq);
        double d = fabs((double)x[t] - (double)r[t]);
        if (!(d <= md)) /* NaN counts as infinitely wrong */
            md = isnan(d) ? INFINITY : d;
    }
    a->max_diff = md;
    a->kl += kl > 0 ? kl : 0; /* KL >= 0; rounding can leave -1e-17 */
    a->agree += arg == e->ref_arg[i];
}

/* ---------------------------------------------------------------- sessions */

static int s_prov_miss(void *arg, uint32_t layer, float *k, float *v)
{
    (void)arg;
    (void)layer;
    (void)k;
    (void)v;
    return KVEDGE_DECODER_MISS;
}

/* The context's K/V of each layer from e->lk[layer], e->lv[layer]. */
static int s_prov_copy(void *arg, uint32_t layer, float *k, float *v)
{
    s_eval_t *e = arg;
    memcpy(k, e->lk[layer], e->kvf * sizeof(float));
    memcpy(v, e->lv[layer], e->kvf * sizeof(float));
    return KVEDGE_OK;
}

/* Runs the continuation doc[K .. K+M) with teacher forcing over the context doc[0 .. K):
 * position i's logits score target doc[K + i + 1]. acc NULL: the reference run, whose logits
 * are kept in e->ref (provider MISS: the session computes the context itself). */
static int s_session(s_eval_t *e, const int32_t *doc, kvedge_decoder_kv_fn prov, s_acc_t *acc)
{
    const uint32_t V = e->c->vocab;
    const int32_t *cont = doc + e->K;
    for (uint32_t i = 0; i < e->M; i++) {
        float *x = acc ? e->cur : e->ref + (size_t)i * V;
        int rc =
            i == 0 ? kvedge_decoder_session_begin(e->sess, doc, e->K, prov, e, cont, 1, e->M - 1, x)
                   : kvedge_decoder_session_step(e->sess, cont[i], x);
        if (rc != KVEDGE_OK)
            return rc;
        if (acc) {
            s_score(e, i, x, cont[i + 1], acc);
        } else {
            e->ref_lse[i] = kvedge_eval_lse(x, V, &e->ref_arg[i]);
            e->ref_acc.nll += e->ref_lse[i] - x[cont[i + 1]];
            e->ref_acc.n++;
            e->ref_acc.agree++;
        }
    }
    return KVEDGE_OK;
}

/* ---------------------------------------------------------------- fetching */

/* One FETCH of every layer into k, v ([layers][kv_heads][K][head_dim] fp32). Returns 0 when
 * every layer is resident, KVEDGE_ENOTFOUND when one was missed, or the error that ended
 * it. */
static int s_fetch_once(s_eval_t *e, const kvedge_model_t *m, size_t n_ids, float *k, float *v)
{
    const uint32_t L = e->c->layers;
    kvedge_kv_dst_t *kd = calloc(L, sizeof *kd), *vd = calloc(L, sizeof *vd);
    if (!kd || !vd) {
        free(kd);
        free(vd);
        return KVEDGE_ENOMEM;
    }
    for (uint32_t l = 0; l < L; l++) {
        kvedge_kv_dst_t t = {.layout = KVEDGE_KV_CONTIG,
                             .dtype = KVEDGE_DTYPE_FP32,
                             .base = k + (size_t)l * e->kvf,
                             .cap_bytes = e->kvf * sizeof(float),
                             .heads = kvedge_decoder_kv_heads(e->o->decoder),
                             .head_dim = e->c->head_dim,
                             .tokens_cap = e->K};
        kd[l] = t;
        t.base = v + (size_t)l * e->kvf;
        vd[l] = t;
    }
    kvedge_pipeline_opts_t po = {
        .size = sizeof(kvedge_pipeline_opts_t),
        .client = e->o->proxy,
        .model = m,
        .chunks = e->ids,
        .n_chunks = n_ids,
        .chunk_tokens = e->ct,
        .tokens = e->K,
        .first_layer = 0,
        .layers = (uint16_t)L,
        .k = kd,
        .v = vd,
        .slot_bytes = kvedge_e2e_slot_bytes(e->K, e->ct, kvedge_decoder_kv_heads(e->o->decoder),
                                            e->c->head_dim),
        .deadline_ms = e->o->deadline_ms,
    };
    kvedge_pipeline_t *pipe = NULL;
    int rc = kvedge_pipeline_open(&po, &pipe);
    for (uint32_t l = 0; rc == KVEDGE_OK && l < L; l++)
        rc = kvedge_pipeline_wait(pipe, (uint16_t)l);
    kvedge_pipeline_destroy(&pipe);
    free(vd);
    free(kd);
    return rc;
}

/* ---------------------------------------------------------------- schemes coded here */

/* A scheme a node derives (tc, +ec): coded in this process, not put (eval.h). */
static bool s_local(const kvedge_eval_scheme_t *s)
{
    return s->scheme == KVEDGE_SCHEME_TC || s->ec;
}

/* One (layer, head) block of t tokens of scheme st from fp32 K and V [t][head_dim], as a node
 * would hold it: tc against the basis, or the int8/int4 block recoded with rANS. *out is
 * malloc'd. */
static int s_local_block(const s_eval_t *e, const s_stored_t *st, uint32_t l, uint32_t h,
                         uint32_t t, const float *kf, const float *vf, uint8_t **out, size_t *len)
{
    const uint16_t D = (uint16_t)e->c->head_dim;
    if (st->s.scheme == KVEDGE_SCHEME_TC)
        return kvedge_block_encode_tc(e->basis, l, h, KVEDGE_DTYPE_FP32, t, D, kf, vf, out, len);
    kvedge_block_spec_t spec = {.dtype = KVEDGE_DTYPE_FP32,
                                .scheme = st->s.scheme,
                                .tokens = t,
                                .head_dim = D,
                                .group_size =
                                    st->s.scheme == KVEDGE_SCHEME_INT4 ? st->s.group_size : 0};
    size_t cap = kvedge_block_encoded_bound(&spec), n = 0;
    uint8_t *plain = malloc(cap);
    if (!plain)
        return KVEDGE_ENOMEM;
    kvedge_block_info_t info;
    int rc = kvedge_block_encode(&spec, kf, vf, plain, cap, &n);
    if (rc == KVEDGE_OK)
        rc = kvedge_block_parse(plain, n, &info);
    if (rc == KVEDGE_OK)
        rc = kvedge_block_recode(&info, true, false, out, len);
    free(plain);
    return rc;
}

/* Codes the document's context in scheme st->s here, block by block, and decodes every block
 * into st->k, st->v (kvedge_block_decode); the blocks' bytes count as put. */
static int s_local_code(s_eval_t *e, s_stored_t *st, const int32_t *ctx)
{
    int rc = KVEDGE_OK;
    if (!e->have_src) {
        rc = kvedge_decoder_prefill(e->o->decoder, ctx, e->K, NULL, e->src_k, e->src_v);
        e->have_src = rc == KVEDGE_OK;
    }
    const uint32_t L = e->c->layers, H = kvedge_decoder_kv_heads(e->o->decoder);
    const uint32_t D = e->c->head_dim;
    for (uint32_t l = 0; rc == KVEDGE_OK && l < L; l++)
        for (uint32_t h = 0; rc == KVEDGE_OK && h < H; h++)
            for (uint32_t start = 0; rc == KVEDGE_OK && start < e->K; start += e->ct) {
                const uint32_t t = e->K - start < e->ct ? e->K - start : e->ct;
                const size_t off = (((size_t)l * H + h) * e->K + start) * D;
                uint8_t *blk = NULL;
                size_t len = 0;
                kvedge_block_info_t info;
                rc = s_local_block(e, st, l, h, t, e->src_k + off, e->src_v + off, &blk, &len);
                if (rc == KVEDGE_OK)
                    rc = kvedge_block_parse(blk, len, &info);
                if (rc == KVEDGE_OK)
                    rc = kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, st->k + off, st->v + off);
                free(blk);
                if (rc == KVEDGE_OK && st->row >= 0) {
                    e->row_acc[st->row].bytes += len;
                    e->row_acc[st->row].fp16_bytes += kvedge_block_fp16_bytes(t, (uint16_t)D);
                }
            }
    return rc;
}

/* Puts the document's context in scheme st->s and fetches it back through the proxy into
 * st->k, st->v; a refusal for an unknown model or a missed layer is retried for wait_ms. A
 * scheme a node derives is coded here instead (s_local_code). */
static int s_store_fetch(s_eval_t *e, s_stored_t *st, const int32_t *ctx)
{
    if (s_local(&st->s))
        return s_local_code(e, st, ctx);
    kvedge_e2e_prefill_stats_t ps;
    int rc = kvedge_e2e_prefill(e->o->cloud, e->o->decoder, &st->model, ctx, e->K, e->ct, &st->q,
                                e->ids, e->max_ids, &ps);
    if (rc != KVEDGE_OK)
        return rc;
    if (st->row >= 0) {
        e->row_acc[st->row].bytes += ps.bytes;
        e->row_acc[st->row].fp16_bytes += ps.fp16_bytes;
    }
    /* The edge's own chunk ids, from the same context (equal to the cloud's). */
    size_t n_ids = 0;
    rc = kvedge_e2e_chunks(&st->model, ctx, e->K, e->ct, e->ids, e->max_ids, &n_ids);
    if (rc != KVEDGE_OK)
        return rc;
    int wait_ms = e->o->wait_ms > 0 ? e->o->wait_ms : KVEDGE_EVAL_WAIT_MS_DEFAULT;
    double until = s_now_s() + wait_ms / 1e3;
    for (;;) {
        rc = s_fetch_once(e, &st->model, n_ids, st->k, st->v);
        if (rc == KVEDGE_OK || (rc != KVEDGE_ENOMODEL && rc != KVEDGE_ENOTFOUND) ||
            s_now_s() >= until)
            return rc;
        s_sleep_ms(KVEDGE_EVAL_RETRY_MS);
    }
}

/* ---------------------------------------------------------------- the run */

static void s_row(kvedge_eval_row_t *r, const char *name, int layer, const s_acc_t *a,
                  double goal_pct)
{
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->layer = layer;
    r->positions = a->n;
    r->nll = a->n ? a->nll / (double)a->n : NAN;
    r->ppl = exp(r->nll);
    r->agreement = a->n ? (double)a->agree / (double)a->n : NAN;
    r->max_abs_diff = a->max_diff;
    r->kl = a->n ? a->kl / (double)a->n : NAN;
    r->bytes = a->bytes;
    r->fp16_bytes = a->fp16_bytes;
    r->goal_pct = goal_pct;
}

static void s_goal(kvedge_eval_row_t *r, double base_ppl, bool lossless)
{
    r->ppl_rel = r->ppl / base_ppl - 1;
    if (r->goal_pct < 0)
        r->goal_met = false;
    else if (lossless)
        r->goal_met = r->max_abs_diff == 0;
    else
        r->goal_met = fabs(r->ppl_rel) * 100 <= r->goal_pct;
}

/* Adds scheme s to the stored list unless a scheme of that name is there; returns its index. */
static size_t s_stored_add(s_eval_t *e, const kvedge_eval_scheme_t *s)
{
    for (size_t i = 0; i < e->n_st; i++)
        if (strcmp(e->st[i].s.name, s->name) == 0)
            return i;
    s_stored_t *st = &e->st[e->n_st];
    memset(st, 0, sizeof *st);
    st->s = *s;
    st->row = -1;
    return e->n_st++;
}

/* A tc scheme's basis: the registered one of the model, of the model's shape. */
static int s_check_basis(const kvedge_eval_opts_t *o)
{
    const kvedge_basis_t *b = kvedge_basis_find_model(o->model->id);
    if (!b)
        return KVEDGE_ENOBASIS;
    if (kvedge_basis_layers(b) != o->model->layers ||
        kvedge_basis_kv_heads(b) != o->model->kv_heads ||
        kvedge_basis_head_dim(b) != o->model->head_dim)
        return KVEDGE_ESHAPE;
    return KVEDGE_OK;
}

static int s_check(const kvedge_eval_opts_t *o)
{
    if (!o || !o->decoder || !o->model || !o->cloud || !o->proxy || !o->docs || !o->doc_len ||
        o->n_docs == 0 || o->ctx_tokens == 0 || o->cont_tokens == 0 || !o->schemes ||
        o->n_schemes == 0 || o->n_schemes > KVEDGE_EVAL_MAX_SCHEMES ||
        (o->n_profiles && !o->profiles) || o->n_profiles > KVEDGE_EVAL_MAX_PROFILES ||
        o->deadline_ms < 0 || o->wait_ms < 0 || !(o->max_s >= 0) ||
        o->chunk_tokens > KVEDGE_BLOCK_MAX_TOKENS)
        return KVEDGE_EINVAL;
    const kvedge_decoder_config_t *c = kvedge_decoder_config(o->decoder);
    if (c->layers == 0 || c->layers > KVEDGE_FETCH_MAX_LAYERS || c->layers != o->model->layers ||
        kvedge_decoder_kv_heads(o->decoder) != o->model->kv_heads ||
        c->head_dim != o->model->head_dim || kvedge_model_check(o->model) != KVEDGE_OK)
        return KVEDGE_EINVAL;
    for (size_t i = 0; i < o->n_schemes + o->n_profiles; i++) {
        const kvedge_eval_scheme_t *s =
            i < o->n_schemes ? &o->schemes[i] : &o->profiles[i - o->n_schemes];
        kvedge_eval_scheme_t again;
        kvedge_model_t m;
        /* Only canonical, well-formed schemes: the name is the store's model id. */
        if (memchr(s->name, '\0', sizeof s->name) == NULL ||
            kvedge_eval_scheme_parse(s->name, &again) != KVEDGE_OK ||
            strcmp(again.name, s->name) != 0 || again.scheme != s->scheme ||
            again.dtype != s->dtype || again.group_size != s->group_size ||
            again.keep_pct != s->keep_pct || again.ec != s->ec)
            return KVEDGE_EINVAL;
        int rc = kvedge_eval_model(o->model, s, &m);
        if (rc == KVEDGE_OK && s->scheme == KVEDGE_SCHEME_TC)
            rc = s_check_basis(o);
        if (rc != KVEDGE_OK)
            return rc;
        /* Names are unique within the schemes and within the profiles. */
        size_t first = i < o->n_schemes ? 0 : o->n_schemes;
        for (size_t j = first; j < i; j++) {
            const kvedge_eval_scheme_t *t =
                j < o->n_schemes ? &o->schemes[j] : &o->profiles[j - o->n_schemes];
            if (strcmp(t->name, s->name) == 0)
                return KVEDGE_EINVAL;
        }
    }
    if ((uint64_t)o->ctx_tokens + o->cont_tokens > c->max_positions)
        return KVEDGE_ETOOBIG;
    return KVEDGE_OK;
}

static void s_eval_free(s_eval_t *e)
{
    for (size_t i = 0; i < e->n_st; i++)
        if (e->st[i].keep) {
            free(e->st[i].k);
            free(e->st[i].v);
        }
    for (size_t p = 0; p < KVEDGE_EVAL_MAX_PROFILES; p++)
        free(e->prof_acc[p]);
    free(e->src_v);
    free(e->src_k);
    free(e->lv);
    free(e->lk);
    free(e->ids);
    free(e->scratch_v);
    free(e->scratch_k);
    free(e->cur);
    free(e->ref_arg);
    free(e->ref_lse);
    free(e->ref);
    kvedge_decoder_session_destroy(&e->sess);
}

/* Sets up the stored schemes (the list's, the profiles', and fp32 lossless when profiles
 * need it) and the buffers. */
static int s_eval_init(s_eval_t *e, const kvedge_eval_opts_t *o)
{
    memset(e, 0, sizeof *e);
    e->o = o;
    e->c = kvedge_decoder_config(o->decoder);
    e->K = o->ctx_tokens;
    e->M = o->cont_tokens;
    e->ct = o->chunk_tokens ? o->chunk_tokens : KVEDGE_E2E_CHUNK_TOKENS_DEFAULT;
    e->kvf = kvedge_decoder_kv_floats(o->decoder, e->K);
    e->lossless = SIZE_MAX;
    for (size_t i = 0; i < o->n_schemes; i++)
        e->st[s_stored_add(e, &o->schemes[i])].row = (int)i;
    if (o->n_profiles) {
        kvedge_eval_scheme_t ll;
        kvedge_eval_scheme_parse("lossless", &ll);
        e->lossless = s_stored_add(e, &ll);
        e->st[e->lossless].keep = true;
    }
    for (size_t p = 0; p < o->n_profiles; p++) {
        e->prof[p] = s_stored_add(e, &o->profiles[p]);
        e->st[e->prof[p]].keep = true;
    }
    const uint32_t L = e->c->layers, V = e->c->vocab;
    const size_t layer_floats = (size_t)L * e->kvf;
    e->sess = kvedge_decoder_session_new(o->decoder);
    e->ref = malloc((size_t)e->M * V * sizeof *e->ref);
    e->ref_lse = malloc(e->M * sizeof *e->ref_lse);
    e->ref_arg = malloc(e->M * sizeof *e->ref_arg);
    e->cur = malloc(V * sizeof *e->cur);
    e->scratch_k = malloc(layer_floats * sizeof(float));
    e->scratch_v = malloc(layer_floats * sizeof(float));
    e->max_ids = (e->K + e->ct - 1) / e->ct;
    e->ids = malloc(e->max_ids * sizeof *e->ids);
    e->lk = malloc(L * sizeof *e->lk);
    e->lv = malloc(L * sizeof *e->lv);
    bool ok = e->sess && e->ref && e->ref_lse && e->ref_arg && e->cur && e->scratch_k &&
              e->scratch_v && e->ids && e->lk && e->lv;
    for (size_t p = 0; ok && p < o->n_profiles; p++)
        ok = (e->prof_acc[p] = calloc(L, sizeof *e->prof_acc[p])) != NULL;
    for (size_t i = 0; ok && i < e->n_st; i++) {
        s_stored_t *st = &e->st[i];
        kvedge_eval_model(o->model, &st->s, &st->model);
        if (s_local(&st->s) && !e->src_k) {
            e->src_k = malloc(layer_floats * sizeof(float));
            e->src_v = malloc(layer_floats * sizeof(float));
            ok = e->src_k && e->src_v;
        }
        if (st->s.scheme == KVEDGE_SCHEME_TC)
            e->basis = kvedge_basis_find_model(o->model->id);
        kvedge_e2e_quant_default(&st->q);
        st->q.scheme = st->s.scheme;
        st->q.dtype = st->s.dtype;
        st->q.group_size = st->s.group_size;
        st->q.keep_channels = (uint16_t)kvedge_eval_keep_channels(st->s.keep_pct, e->c->head_dim);
        if (st->q.keep_channels == e->c->head_dim)
            st->q.keep_channels = 0;
        if (st->keep) {
            st->k = malloc(layer_floats * sizeof(float));
            st->v = malloc(layer_floats * sizeof(float));
            ok = st->k && st->v;
        } else {
            st->k = e->scratch_k;
            st->v = e->scratch_v;
        }
    }
    return ok ? KVEDGE_OK : KVEDGE_ENOMEM;
}

/* Every measurement of one document. */
static int s_document(s_eval_t *e, const int32_t *doc)
{
    const uint32_t L = e->c->layers;
    e->have_src = false;
    int rc = s_session(e, doc, s_prov_miss, NULL);
    for (size_t i = 0; rc == KVEDGE_OK && i < e->n_st; i++) {
        s_stored_t *st = &e->st[i];
        rc = s_store_fetch(e, st, doc);
        if (rc != KVEDGE_OK || st->row < 0)
            continue;
        for (uint32_t l = 0; l < L; l++) {
            e->lk[l] = st->k + (size_t)l * e->kvf;
            e->lv[l] = st->v + (size_t)l * e->kvf;
        }
        rc = s_session(e, doc, s_prov_copy, &e->row_acc[st->row]);
    }
    /* The profile: one layer from the profile scheme's copy, the others lossless. */
    for (size_t p = 0; rc == KVEDGE_OK && p < e->o->n_profiles; p++) {
        const s_stored_t *ll = &e->st[e->lossless], *ps = &e->st[e->prof[p]];
        for (uint32_t x = 0; rc == KVEDGE_OK && x < L; x++) {
            for (uint32_t l = 0; l < L; l++) {
                const s_stored_t *from = l == x ? ps : ll;
                e->lk[l] = from->k + (size_t)l * e->kvf;
                e->lv[l] = from->v + (size_t)l * e->kvf;
            }
            rc = s_session(e, doc, s_prov_copy, &e->prof_acc[p][x]);
        }
    }
    return rc;
}

static int s_result(s_eval_t *e, const size_t *used, size_t n_used, size_t n_short, double seconds,
                    kvedge_eval_result_t **out)
{
    const kvedge_eval_opts_t *o = e->o;
    const uint32_t L = e->c->layers;
    kvedge_eval_result_t *r = calloc(1, sizeof *r);
    if (!r)
        return KVEDGE_ENOMEM;
    r->layers = L;
    r->ctx_tokens = e->K;
    r->cont_tokens = e->M;
    r->n_docs = n_used;
    r->n_short = n_short;
    r->seconds = seconds;
    r->doc_index = malloc((n_used ? n_used : 1) * sizeof *r->doc_index);
    bool ok = r->doc_index != NULL;
    for (size_t p = 0; ok && p < o->n_profiles; p++)
        ok = (r->profile[p] = calloc(L, sizeof *r->profile[p])) != NULL;
    if (!ok) {
        kvedge_eval_result_destroy(&r);
        return KVEDGE_ENOMEM;
    }
    memcpy(r->doc_index, used, n_used * sizeof *used);
    s_row(&r->reference, "reference", -1, &e->ref_acc, -1);
    r->n_schemes = o->n_schemes;
    double base = r->reference.ppl;
    for (size_t i = 0; i < o->n_schemes; i++) {
        s_row(&r->scheme[i], o->schemes[i].name, -1, &e->row_acc[i], o->schemes[i].goal_pct);
        if (strcmp(o->schemes[i].name, "lossless") == 0)
            base = r->scheme[i].ppl;
    }
    r->reference.ppl_rel = r->reference.ppl / base - 1;
    for (size_t i = 0; i < o->n_schemes; i++)
        s_goal(&r->scheme[i], base, strcmp(o->schemes[i].name, "lossless") == 0);
    r->n_profiles = o->n_profiles;
    for (size_t p = 0; p < o->n_profiles; p++)
        for (uint32_t l = 0; l < L; l++) {
            s_row(&r->profile[p][l], o->profiles[p].name, (int)l, &e->prof_acc[p][l], -1);
            s_goal(&r->profile[p][l], base, false);
        }
    *out = r;
    return KVEDGE_OK;
}

int kvedge_eval_run(const kvedge_eval_opts_t *o, kvedge_eval_result_t **out)
{
    if (!out)
        return KVEDGE_EINVAL;
    int rc = s_check(o);
    if (rc != KVEDGE_OK)
        return rc;
    const size_t need = (size_t)o->ctx_tokens + o->cont_tokens + 1;
    size_t longest = 0;
    for (size_t d = 0; d < o->n_docs; d++)
        if (o->docs[d] && o->doc_len[d] > longest)
            longest = o->doc_len[d];
    if (longest < need)
        return KVEDGE_EINVAL; /* no document can be measured */
    s_eval_t e;
    rc = s_eval_init(&e, o);
    size_t *used = malloc(o->n_docs * sizeof *used), n_used = 0, n_short = 0;
    if (rc == KVEDGE_OK && !used)
        rc = KVEDGE_ENOMEM;
    double t0 = s_now_s();
    for (size_t d = 0; rc == KVEDGE_OK && d < o->n_docs; d++) {
        if (o->max_docs && n_used >= o->max_docs)
            break;
        if (n_used && o->max_s > 0 && s_now_s() - t0 >= o->max_s)
            break;
        if (!o->docs[d] || o->doc_len[d] < need) {
            n_short++;
            continue;
        }
        for (size_t t = 0; t < need && rc == KVEDGE_OK; t++)
            if (o->docs[d][t] < 0 || (uint32_t)o->docs[d][t] >= e.c->vocab)
                rc = KVEDGE_EINVAL;
        if (rc == KVEDGE_OK)
            rc = s_document(&e, o->docs[d]);
        if (rc == KVEDGE_OK) {
            used[n_used++] = d;
            if (o->progress)
                o->progress(o->progress_arg, n_used, d, s_now_s() - t0);
        }
    }
    if (rc == KVEDGE_OK)
        rc = s_result(&e, used, n_used, n_short, s_now_s() - t0, out);
    free(used);
    s_eval_free(&e);
    return rc;
}

void kvedge_eval_result_destroy(kvedge_eval_result_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kvedge_eval_result_t *r = *self_p;
    *self_p = NULL;
    for (size_t p = 0; p < KVEDGE_EVAL_MAX_PROFILES; p++)
        free(r->profile[p]);
    free(r->doc_index);
    free(r);
}

/* ---------------------------------------------------------------- printing */

/* A number, or null when not finite (JSON has no NaN or infinity). */
static void s_json_num(FILE *f, const char *key, double x, bool comma)
{
    if (isfinite(x))
        fprintf(f, "\"%s\":%.9g%s", key, x, comma ? "," : "");
    else
        fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
}

/* How far a row is from its goal: |ppl_rel| in percent less the goal; 0 when met. */
static double s_miss_pct(const kvedge_eval_row_t *r)
{
    if (r->goal_pct < 0 || r->goal_met)
        return 0;
    return fabs(r->ppl_rel) * 100 - r->goal_pct;
}

static void s_json_row(FILE *f, const kvedge_eval_row_t *r)
{
    fprintf(f, "{\"name\":\"%s\",\"layer\":%d,\"positions\":%llu,", r->name, r->layer,
            (unsigned long long)r->positions);
    s_json_num(f, "nll", r->nll, true);
    s_json_num(f, "ppl", r->ppl, true);
    s_json_num(f, "ppl_rel_pct", r->ppl_rel * 100, true);
    s_json_num(f, "agreement", r->agreement, true);
    s_json_num(f, "max_abs_logit_diff", r->max_abs_diff, true);
    s_json_num(f, "kl", r->kl, true);
    fprintf(f, "\"bytes\":%llu,\"fp16_bytes\":%llu,", (unsigned long long)r->bytes,
            (unsigned long long)r->fp16_bytes);
    if (r->goal_pct < 0) {
        fprintf(f, "\"goal_pct\":null,\"goal_met\":null,\"goal_miss_pct\":null}");
        return;
    }
    s_json_num(f, "goal_pct", r->goal_pct, true);
    fprintf(f, "\"goal_met\":%s,", r->goal_met ? "true" : "false");
    s_json_num(f, "goal_miss_pct", s_miss_pct(r), false);
    fputc('}', f);
}

static void s_print_json(FILE *f, const kvedge_eval_result_t *r)
{
    fprintf(f,
            "{\"layers\":%u,\"context_tokens\":%u,\"continuation_tokens\":%u,\"documents\":%zu,"
            "\"doc_index\":[",
            r->layers, r->ctx_tokens, r->cont_tokens, r->n_docs);
    for (size_t i = 0; i < r->n_docs; i++)
        fprintf(f, "%s%zu", i ? "," : "", r->doc_index[i]);
    fprintf(f, "],\"skipped_short\":%zu,\"positions\":%llu,", r->n_short,
            (unsigned long long)r->reference.positions);
    s_json_num(f, "seconds", r->seconds, true);
    fprintf(f, "\"reference\":");
    s_json_row(f, &r->reference);
    fprintf(f, ",\"schemes\":[");
    for (size_t i = 0; i < r->n_schemes; i++) {
        if (i)
            fputc(',', f);
        s_json_row(f, &r->scheme[i]);
    }
    fprintf(f, "],\"profiles\":[");
    for (size_t p = 0; p < r->n_profiles; p++) {
        fprintf(f, "%s{\"scheme\":\"%s\",\"layers\":[", p ? "," : "", r->profile[p][0].name);
        for (uint32_t l = 0; l < r->layers; l++) {
            if (l)
                fputc(',', f);
            s_json_row(f, &r->profile[p][l]);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]}\n");
}

/* The goal column of a scheme row. */
static void s_goal_text(const kvedge_eval_row_t *r, char *buf, size_t len)
{
    if (r->goal_pct < 0)
        snprintf(buf, len, "-");
    else if (r->goal_pct == 0 && strcmp(r->name, "lossless") == 0)
        snprintf(buf, len, "bit-identical: %s", r->goal_met ? "met" : "MISSED");
    else if (r->goal_met)
        snprintf(buf, len, "<= %.1f%%: met", r->goal_pct);
    else
        snprintf(buf, len, "<= %.1f%%: MISSED by %.3f pts", r->goal_pct, s_miss_pct(r));
}

void kvedge_eval_print(FILE *f, const kvedge_eval_result_t *r, bool json)
{
    if (!f || !r)
        return;
    if (json) {
        s_print_json(f, r);
        return;
    }
    fprintf(f,
            "%zu documents (%zu too short skipped), context %u tokens, continuation %u: %llu "
            "positions scored, %u layers, %.1f s\n",
            r->n_docs, r->n_short, r->ctx_tokens, r->cont_tokens,
            (unsigned long long)r->reference.positions, r->layers, r->seconds);
    fprintf(f, "%-19s %9s %10s %8s %11s %10s %6s  %s\n", "scheme", "ppl", "dppl", "agree",
            "max|dlogit|", "KL", "/fp16", "goal");
    fprintf(f, "%-19s %9.4f %9.4f%% %8s %11s %10s %6s  %s\n", "reference (fp32)", r->reference.ppl,
            r->reference.ppl_rel * 100, "1", "0", "0", "-", "context recomputed locally");
    for (size_t i = 0; i < r->n_schemes; i++) {
        const kvedge_eval_row_t *x = &r->scheme[i];
        char goal[64];
        s_goal_text(x, goal, sizeof goal);
        fprintf(f, "%-19s %9.4f %+9.4f%% %8.4f %11.4g %10.3g %6.3f  %s\n", x->name, x->ppl,
                x->ppl_rel * 100, x->agreement, x->max_abs_diff, x->kl,
                x->fp16_bytes ? (double)x->bytes / (double)x->fp16_bytes : NAN, goal);
    }
    if (r->n_profiles == 0)
        return;
    fprintf(f, "\nper-layer sensitivity: only layer l in the scheme, the others lossless\n%5s",
            "layer");
    for (size_t p = 0; p < r->n_profiles; p++) {
        char head[KVEDGE_EVAL_NAME_BYTES + 8];
        snprintf(head, sizeof head, "%s dppl", r->profile[p][0].name);
        fprintf(f, "  %18s %10s %8s", head, "KL", "agree");
    }
    fputc('\n', f);
    for (uint32_t l = 0; l < r->layers; l++) {
        fprintf(f, "%5u", l);
        for (size_t p = 0; p < r->n_profiles; p++) {
            const kvedge_eval_row_t *x = &r->profile[p][l];
            fprintf(f, "  %+17.4f%% %10.3g %8.4f", x->ppl_rel * 100, x->kl, x->agreement);
        }
        fputc('\n', f);
    }
}

void kvedge_eval_print_schemes_dat(FILE *f, const kvedge_eval_result_t *r)
{
    if (!f || !r)
        return;
    fprintf(f, "# kvedge eval: %zu documents, context %u, continuation %u, %llu positions\n",
            r->n_docs, r->ctx_tokens, r->cont_tokens, (unsigned long long)r->reference.positions);
    fprintf(f, "# index name ppl ppl_rel_pct agreement kl max_abs_diff bytes_over_fp16\n");
    for (size_t i = 0; i < r->n_schemes; i++) {
        const kvedge_eval_row_t *x = &r->scheme[i];
        fprintf(f, "%zu %s %.9g %.9g %.9g %.9g %.9g %.6g\n", i, x->name, x->ppl, x->ppl_rel * 100,
                x->agreement, x->kl, x->max_abs_diff,
                x->fp16_bytes ? (double)x->bytes / (double)x->fp16_bytes : 0.0);
    }
}

void kvedge_eval_print_layers_dat(FILE *f, const kvedge_eval_result_t *r)
{
    if (!f || !r)
        return;
    fprintf(f, "# kvedge eval: only layer l in the profile scheme, the others lossless\n# layer");
    for (size_t p = 0; p < r->n_profiles; p++)
        fprintf(f, " %s_ppl_rel_pct %s_kl", r->profile[p][0].name, r->profile[p][0].name);
    fputc('\n', f);
    for (uint32_t l = 0; l < r->layers; l++) {
        fprintf(f, "%u", l);
        for (size_t p = 0; p < r->n_profiles; p++)
            fprintf(f, " %.9g %.9g", r->profile[p][l].ppl_rel * 100, r->profile[p][l].kl);
        fputc('\n', f);
    }
}

/* ---------------------------------------------------------------- the quality profile */

/* A number in the fewest digits that read back as the same double (JSON has no NaN: the
 * caller checked). */
static void s_exact(FILE *f, double x)
{
    char buf[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    fputs(buf, f);
}

static bool s_row_ok(const kvedge_eval_row_t *x)
{
    return isfinite(x->ppl_rel) && x->ppl_rel > -1 && isfinite(x->kl) && x->kl >= 0 &&
           isfinite(x->agreement) && x->agreement >= 0 && x->agreement <= 1;
}

/* The scheme row i as a lossy ladder rung (with finite figures), or false. */
static bool s_whole_rung(const kvedge_eval_row_t *x, kvedge_prec_t *rung)
{
    kvedge_eval_scheme_t s;
    return kvedge_eval_scheme_parse(x->name, &s) == KVEDGE_OK &&
           kvedge_eval_scheme_prec(&s, rung) == KVEDGE_OK && *rung != KVEDGE_PREC_LOSSLESS &&
           !KVEDGE_PREC_IS_EC(*rung);
}

int kvedge_eval_profile_write(FILE *f, const kvedge_eval_result_t *r, const char *model_id)
{
    if (!f || !r || !model_id || r->n_profiles == 0 || r->n_profiles > KVEDGE_EVAL_MAX_PROFILES ||
        r->layers == 0 || model_id[0] == '\0' ||
        strnlen(model_id, KVEDGE_MODEL_ID_MAX_BYTES + 1) > KVEDGE_MODEL_ID_MAX_BYTES)
        return KVEDGE_EINVAL;
    kvedge_prec_t rung[KVEDGE_EVAL_MAX_PROFILES];
    for (size_t p = 0; p < r->n_profiles; p++) {
        kvedge_eval_scheme_t s;
        if (!r->profile[p] || kvedge_eval_scheme_parse(r->profile[p][0].name, &s) != KVEDGE_OK ||
            kvedge_eval_scheme_prec(&s, &rung[p]) != KVEDGE_OK || KVEDGE_PREC_IS_EC(rung[p]))
            return KVEDGE_EINVAL;
        for (size_t q = 0; q < p; q++)
            if (rung[q] == rung[p])
                return KVEDGE_EINVAL;
        for (uint32_t l = 0; l < r->layers; l++)
            if (!s_row_ok(&r->profile[p][l]))
                return KVEDGE_EINVAL;
    }
    double base = r->reference.ppl;
    for (size_t i = 0; i < r->n_schemes; i++) {
        kvedge_prec_t x;
        if (strcmp(r->scheme[i].name, "lossless") == 0)
            base = r->scheme[i].ppl;
        else if (s_whole_rung(&r->scheme[i], &x) && !s_row_ok(&r->scheme[i]))
            return KVEDGE_EINVAL;
    }

    fprintf(f, "{\n  \"kvedge_quality_profile\": %d,\n  \"model\": ", KVEDGE_QUALITY_VERSION);
    kvedge_e2e_json_text(f, model_id, strlen(model_id));
    fprintf(f,
            ",\n  \"layers\": %u,\n  \"context_tokens\": %u,\n  \"continuation_tokens\": %u,\n"
            "  \"documents\": %zu,\n  \"positions\": %llu,\n  \"lossless_ppl\": ",
            r->layers, r->ctx_tokens, r->cont_tokens, r->n_docs,
            (unsigned long long)r->reference.positions);
    if (isfinite(base))
        s_exact(f, base);
    else
        fputs("null", f);
    fprintf(f, ",\n  \"writer\": \"kvedge eval\",\n  \"rungs\": [");
    for (size_t p = 0; p < r->n_profiles; p++)
        fprintf(f, "%s\"%s\"", p ? ", " : "", kvedge_prec_name(rung[p]));
    fprintf(f, "],\n  \"per_layer\": [\n");
    static const char *const keys[3] = {"ppl_pct", "kl", "agreement"};
    for (uint32_t l = 0; l < r->layers; l++) {
        fprintf(f, "    {\"layer\": %u", l);
        for (int k = 0; k < 3; k++) {
            fprintf(f, ", \"%s\": [", keys[k]);
            for (size_t p = 0; p < r->n_profiles; p++) {
                const kvedge_eval_row_t *x = &r->profile[p][l];
                if (p)
                    fputs(", ", f);
                s_exact(f, k == 0 ? x->ppl_rel * 100 : k == 1 ? x->kl : x->agreement);
            }
            fputc(']', f);
        }
        fprintf(f, "}%s\n", l + 1 < r->layers ? "," : "");
    }
    fprintf(f, "  ],\n  \"whole_model\": [");
    bool first = true;
    for (size_t i = 0; i < r->n_schemes; i++) {
        const kvedge_eval_row_t *x = &r->scheme[i];
        kvedge_prec_t w;
        if (!s_whole_rung(x, &w))
            continue;
        fprintf(f, "%s\n    {\"rung\": \"%s\", \"ppl_pct\": ", first ? "" : ",",
                kvedge_prec_name(w));
        s_exact(f, x->ppl_rel * 100);
        fputs(", \"kl\": ", f);
        s_exact(f, x->kl);
        fputs(", \"agreement\": ", f);
        s_exact(f, x->agreement);
        if (x->fp16_bytes) {
            fputs(", \"bytes_over_fp16\": ", f);
            s_exact(f, (double)x->bytes / (double)x->fp16_bytes);
        }
        fputc('}', f);
        first = false;
    }
    fprintf(f, "%s]\n}\n", first ? "" : "\n  ");
    return ferror(f) || fflush(f) != 0 ? KVEDGE_EIO : KVEDGE_OK;
}

double kvedge_eval_lse(const float *x, uint32_t n, int32_t *argmax)
{
    float m = x[0];
    uint32_t at = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > m) {
            m = x[i];
            at = i;
        }
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)x[i] - m);
    if (argmax)
        *argmax = (int32_t)at;
    return (double)m + log(sum);
}
