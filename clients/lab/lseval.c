/* The quality of large-small collaboration (lseval.h): per document, the LLM's and the SLM's
 * context K/V, block round trips at each precision, the adapters, and teacher-forced decoder
 * sessions of both models, scored against the LLM's own choices. */
#include "clients/lab/lseval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clients/lab/eval.h"
#include "access/codec/error.h"

static double s_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *kvedge_lseval_kind_name(kvedge_lseval_kind_t kind)
{
    switch (kind) {
    case KVEDGE_LSEVAL_CLOUD_ONLY:
        return "cloud-only";
    case KVEDGE_LSEVAL_EDGE_ONLY:
        return "edge-only";
    case KVEDGE_LSEVAL_PEER:
        return "peer";
    case KVEDGE_LSEVAL_CE_LSLM:
        return "ce-lslm";
    case KVEDGE_LSEVAL_NO_CONTEXT:
        return "no-context";
    }
    return "?";
}

/* ---------------------------------------------------------------- checks */

int kvedge_lseval_adapter_check(const kvedge_adapter_t *a, const kvedge_decoder_t *cloud,
                                const kvedge_decoder_t *edge, char *why, size_t why_len)
{
    char dummy[1];
    if (!why || why_len == 0) {
        why = dummy;
        why_len = sizeof dummy;
    }
    why[0] = '\0';
    if (!a || !cloud || !edge)
        return KVEDGE_EINVAL;
    const kvedge_adapter_info_t *in = kvedge_adapter_info(a);
    const kvedge_decoder_config_t *cc = kvedge_decoder_config(cloud);
    const kvedge_decoder_config_t *ec = kvedge_decoder_config(edge);
    if (!in)
        return KVEDGE_EINVAL;
    const uint32_t kvc = kvedge_decoder_kv_heads(cloud), kve = kvedge_decoder_kv_heads(edge);
    if (in->cloud_layers != cc->layers || in->cloud_heads != kvc ||
        in->cloud_head_dim != cc->head_dim) {
        snprintf(
            why, why_len,
            "the adapter is for a cloud model of %u layers x %u KV heads x %u, not %u x %u x %u",
            in->cloud_layers, in->cloud_heads, in->cloud_head_dim, cc->layers, kvc, cc->head_dim);
        return KVEDGE_ESHAPE;
    }
    if (in->edge_layers != ec->layers || in->edge_heads != kve ||
        in->edge_head_dim != ec->head_dim) {
        snprintf(
            why, why_len,
            "the adapter is for an edge model of %u layers x %u KV heads x %u, not %u x %u x %u",
            in->edge_layers, in->edge_heads, in->edge_head_dim, ec->layers, kve, ec->head_dim);
        return KVEDGE_ESHAPE;
    }
    for (uint32_t e = 0; e < ec->layers; e++) {
        int32_t c = kvedge_adapter_from(a, e);
        if (c != KVEDGE_LAYERMAP_NONE && (c < 0 || (uint32_t)c >= cc->layers)) {
            snprintf(why, why_len,
                     "the adapter maps edge layer %u to cloud layer %d, outside 0..%u", e, (int)c,
                     cc->layers - 1);
            return KVEDGE_ESHAPE;
        }
    }
    return kvedge_adapter_check_rope(a, cloud, edge, why, why_len);
}

/* ---------------------------------------------------------------- block round trip */

int kvedge_lseval_roundtrip(const float *k, const float *v, uint32_t layers, uint32_t heads,
                            uint32_t tokens, uint32_t head_dim, const bool *use,
                            kvedge_scheme_t scheme, uint32_t chunk_tokens, float *k_out,
                            float *v_out, uint64_t *bytes, uint64_t *fp16_bytes)
{
    if (bytes)
        *bytes = 0;
    if (fp16_bytes)
        *fp16_bytes = 0;
    uint32_t ct = chunk_tokens ? chunk_tokens : KVEDGE_LSEVAL_CHUNK_TOKENS_DEFAULT;
    if (!k || !v || !k_out || !v_out || layers == 0 || heads == 0 || tokens == 0 || head_dim == 0 ||
        head_dim > KVEDGE_BLOCK_MAX_HEAD_DIM || ct > KVEDGE_BLOCK_MAX_TOKENS ||
        (scheme != KVEDGE_SCHEME_LOSSLESS && scheme != KVEDGE_SCHEME_INT8 &&
         scheme != KVEDGE_SCHEME_INT4))
        return KVEDGE_EINVAL;
    kvedge_block_spec_t spec = {
        .dtype = KVEDGE_DTYPE_FP32,
        .scheme = scheme,
        .tokens = tokens < ct ? tokens : ct,
        .head_dim = (uint16_t)head_dim,
        .group_size = scheme == KVEDGE_SCHEME_INT4 ? KVEDGE_LSEVAL_INT4_GROUP : 0,
        .lz4 = true,
    };
    size_t cap = kvedge_block_encoded_bound(&spec);
    if (cap == 0)
        return KVEDGE_EINVAL;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return KVEDGE_ENOMEM;
    const size_t layer_floats = (size_t)heads * tokens * head_dim;
    uint64_t total = 0, f16 = 0;
    int rc = KVEDGE_OK;
    for (uint32_t l = 0; rc == KVEDGE_OK && l < layers; l++) {
        size_t lo = (size_t)l * layer_floats;
        if (use && !use[l]) {
            if (k_out != k)
                memcpy(k_out + lo, k + lo, layer_floats * sizeof(float));
            if (v_out != v)
                memcpy(v_out + lo, v + lo, layer_floats * sizeof(float));
            continue;
        }
        for (uint32_t h = 0; rc == KVEDGE_OK && h < heads; h++)
            for (uint32_t start = 0; rc == KVEDGE_OK && start < tokens; start += ct) {
                uint32_t t = tokens - start < ct ? tokens - start : ct;
                size_t off = lo + ((size_t)h * tokens + start) * head_dim;
                spec.tokens = t;
                size_t len = 0;
                kvedge_block_info_t info;
                rc = kvedge_block_encode(&spec, k + off, v + off, buf, cap, &len);
                if (rc == KVEDGE_OK)
                    rc = kvedge_block_check(buf, len, &info);
                if (rc == KVEDGE_OK)
                    rc = kvedge_block_decode(&info, KVEDGE_DTYPE_FP32, k_out + off, v_out + off);
                total += len;
                f16 += kvedge_block_fp16_bytes(t, (uint16_t)head_dim);
            }
    }
    free(buf);
    if (rc == KVEDGE_OK) {
        if (bytes)
            *bytes = total;
        if (fp16_bytes)
            *fp16_bytes = f16;
    }
    return rc;
}

/* ---------------------------------------------------------------- state */

typedef struct {
    double nll, kl; /* sums over positions */
    uint64_t n, agree_cloud, agree_edge;
    double bytes, fp16_bytes; /* sums over documents */
    uint32_t adapted;
    uint64_t computed;
} s_acc_t;

/* Where a session's provider copies a layer's context K/V from. */
typedef struct {
    const float *k, *v; /* [layers][heads][K][head_dim] */
    size_t kvf;         /* floats of one layer */
    const bool *have;   /* [layers]: false = MISS (the session computes it); NULL = all */
} s_src_t;

typedef struct {
    const kvedge_lseval_opts_t *o;
    const kvedge_decoder_config_t *cc, *ec;
    uint32_t K, M, ct, V;
    size_t kvf_c, kvf_e;
    kvedge_decoder_session_t *cs, *es;
    float *ck, *cv; /* the LLM's context K/V, fp32 */
    float *ek, *ev; /* the SLM's */
    float *qk, *qv; /* a round trip's output (the larger of the two shapes) */
    float *ak, *av; /* adapted, SLM-shaped */
    bool *have;     /* [edge layers] */
    bool *use;      /* [cloud layers]: the layers an adapter reads */
    float *ref;     /* [M][V]: cloud-only logits of the document */
    double *ref_lse;
    int32_t *ref_arg, *edge_arg;
    float *cur;
    size_t n_rows;
    kvedge_lseval_row_t row[KVEDGE_LSEVAL_MAX_ROWS];
    s_acc_t acc[KVEDGE_LSEVAL_MAX_ROWS];
} s_ls_t;

static int s_provider(void *arg, uint32_t layer, float *k, float *v)
{
    const s_src_t *s = arg;
    if (s->have && !s->have[layer])
        return KVEDGE_DECODER_MISS;
    memcpy(k, s->k + (size_t)layer * s->kvf, s->kvf * sizeof(float));
    memcpy(v, s->v + (size_t)layer * s->kvf, s->kvf * sizeof(float));
    return KVEDGE_OK;
}

/* Scores position i of row r: x are its logits, target the true next token. The cloud-only
 * row (0) keeps its logits as the reference, the edge-only row (1) its choices. */
static void s_score(s_ls_t *e, size_t r, uint32_t i, const float *x, int32_t target)
{
    const uint32_t V = e->V;
    s_acc_t *a = &e->acc[r];
    int32_t arg;
    double lse = kvedge_eval_lse(x, V, &arg);
    a->nll += lse - x[target];
    a->n++;
    if (r == 0) {
        memcpy(e->ref + (size_t)i * V, x, V * sizeof(float));
        e->ref_lse[i] = lse;
        e->ref_arg[i] = arg;
    } else {
        const float *ref = e->ref + (size_t)i * V;
        double rl = e->ref_lse[i], kl = 0;
        for (uint32_t t = 0; t < V; t++) {
            double lr = (double)ref[t] - rl, lq = (double)x[t] - lse;
            kl += exp(lr) * (lr - lq);
        }
        a->kl += kl > 0 ? kl : 0; /* KL >= 0; rounding can leave -1e-17 */
    }
    if (r == 1) {
        e->edge_arg[i] = arg;
        e->acc[0].agree_edge += e->ref_arg[i] == arg; /* row 0 ran before the choices existed */
    }
    a->agree_cloud += arg == e->ref_arg[i];
    if (r != 0)
        a->agree_edge += arg == e->edge_arg[i];
}

/* Teacher forcing: the continuation cont[0..M) over a context of ctx_len tokens (0: none),
 * position i's logits scoring cont[i + 1], into row r. */
static int s_session(s_ls_t *e, kvedge_decoder_session_t *sess, const int32_t *ctx,
                     uint32_t ctx_len, const s_src_t *src, const int32_t *cont, size_t r)
{
    for (uint32_t i = 0; i < e->M; i++) {
        int rc = i == 0
                     ? kvedge_decoder_session_begin(sess, ctx, ctx_len, ctx_len ? s_provider : NULL,
                                                    (void *)src, cont, 1, e->M - 1, e->cur)
                     : kvedge_decoder_session_step(sess, cont[i], e->cur);
        if (rc != KVEDGE_OK)
            return rc;
        s_score(e, r, i, e->cur, cont[i + 1]);
    }
    return KVEDGE_OK;
}

static void s_free(s_ls_t *e)
{
    kvedge_decoder_session_destroy(&e->cs);
    kvedge_decoder_session_destroy(&e->es);
    free(e->ck);
    free(e->cv);
    free(e->ek);
    free(e->ev);
    free(e->qk);
    free(e->qv);
    free(e->ak);
    free(e->av);
    free(e->have);
    free(e->use);
    free(e->ref);
    free(e->ref_lse);
    free(e->ref_arg);
    free(e->edge_arg);
    free(e->cur);
}

static void s_add_row(s_ls_t *e, const char *name, kvedge_lseval_kind_t kind, int adapter,
                      kvedge_scheme_t scheme)
{
    kvedge_lseval_row_t *r = &e->row[e->n_rows++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    r->kind = kind;
    r->adapter = adapter;
    r->scheme = scheme;
}

static const kvedge_scheme_t s_ce_schemes[3] = {KVEDGE_SCHEME_LOSSLESS, KVEDGE_SCHEME_INT8,
                                                KVEDGE_SCHEME_INT4};

static const char *s_scheme_label(kvedge_scheme_t s)
{
    return s == KVEDGE_SCHEME_INT4 ? "int4-g32" : s == KVEDGE_SCHEME_INT8 ? "int8" : "lossless";
}

static int s_init(s_ls_t *e, const kvedge_lseval_opts_t *o)
{
    memset(e, 0, sizeof *e);
    e->o = o;
    e->cc = kvedge_decoder_config(o->cloud);
    e->ec = kvedge_decoder_config(o->edge);
    e->K = o->ctx_tokens;
    e->M = o->cont_tokens;
    e->ct = o->chunk_tokens ? o->chunk_tokens : KVEDGE_LSEVAL_CHUNK_TOKENS_DEFAULT;
    e->V = e->cc->vocab;
    e->kvf_c = kvedge_decoder_kv_floats(o->cloud, e->K);
    e->kvf_e = kvedge_decoder_kv_floats(o->edge, e->K);
    s_add_row(e, "cloud-only", KVEDGE_LSEVAL_CLOUD_ONLY, -1, KVEDGE_SCHEME_LOSSLESS);
    s_add_row(e, "edge-only", KVEDGE_LSEVAL_EDGE_ONLY, -1, KVEDGE_SCHEME_LOSSLESS);
    s_add_row(e, "peer-int8", KVEDGE_LSEVAL_PEER, -1, KVEDGE_SCHEME_INT8);
    for (size_t a = 0; a < o->n_adapters; a++) {
        const char *an = o->adapter_names && o->adapter_names[a]
                             ? o->adapter_names[a]
                             : kvedge_adapter_fit_name(kvedge_adapter_info(o->adapters[a]));
        for (int s = 0; s < 3; s++) {
            char name[KVEDGE_LSEVAL_NAME_BYTES];
            snprintf(name, sizeof name, "ce-lslm %.24s %s", an, s_scheme_label(s_ce_schemes[s]));
            s_add_row(e, name, KVEDGE_LSEVAL_CE_LSLM, (int)a, s_ce_schemes[s]);
        }
    }
    s_add_row(e, "no-context", KVEDGE_LSEVAL_NO_CONTEXT, -1, KVEDGE_SCHEME_LOSSLESS);
    const size_t Lc = e->cc->layers, Le = e->ec->layers;
    const size_t q = Lc * e->kvf_c > Le * e->kvf_e ? Lc * e->kvf_c : Le * e->kvf_e;
    e->cs = kvedge_decoder_session_new(o->cloud);
    e->es = kvedge_decoder_session_new(o->edge);
    e->ck = malloc(Lc * e->kvf_c * sizeof(float));
    e->cv = malloc(Lc * e->kvf_c * sizeof(float));
    e->ek = malloc(Le * e->kvf_e * sizeof(float));
    e->ev = malloc(Le * e->kvf_e * sizeof(float));
    e->qk = malloc(q * sizeof(float));
    e->qv = malloc(q * sizeof(float));
    e->ak = malloc(Le * e->kvf_e * sizeof(float));
    e->av = malloc(Le * e->kvf_e * sizeof(float));
    e->have = calloc(Le, sizeof *e->have);
    e->use = calloc(Lc, sizeof *e->use);
    e->ref = malloc((size_t)e->M * e->V * sizeof *e->ref);
    e->ref_lse = malloc(e->M * sizeof *e->ref_lse);
    e->ref_arg = malloc(e->M * sizeof *e->ref_arg);
    e->edge_arg = malloc(e->M * sizeof *e->edge_arg);
    e->cur = malloc(e->V * sizeof *e->cur);
    bool ok = e->cs && e->es && e->ck && e->cv && e->ek && e->ev && e->qk && e->qv && e->ak &&
              e->av && e->have && e->use && e->ref && e->ref_lse && e->ref_arg && e->edge_arg &&
              e->cur;
    return ok ? KVEDGE_OK : KVEDGE_ENOMEM;
}

/* One CE-LSLM row: the LLM's mapped layers through blocks in scheme s, adapted into the SLM's
 * layers, the SLM's session over them. */
static int s_ce_row(s_ls_t *e, size_t r, const kvedge_adapter_t *a, kvedge_scheme_t s,
                    const int32_t *doc)
{
    const uint32_t Lc = e->cc->layers, Le = e->ec->layers;
    memset(e->use, 0, Lc * sizeof *e->use);
    for (uint32_t l = 0; l < Le; l++) {
        int32_t c = kvedge_adapter_from(a, l);
        if (c != KVEDGE_LAYERMAP_NONE)
            e->use[c] = true;
    }
    uint64_t bytes = 0, f16 = 0;
    int rc = kvedge_lseval_roundtrip(e->ck, e->cv, Lc, kvedge_decoder_kv_heads(e->o->cloud), e->K,
                                     e->cc->head_dim, e->use, s, e->ct, e->qk, e->qv, &bytes, &f16);
    if (rc != KVEDGE_OK)
        return rc;
    uint32_t adapted = 0;
    for (uint32_t l = 0; l < Le; l++) {
        int32_t c = kvedge_adapter_from(a, l);
        e->have[l] = false;
        if (c == KVEDGE_LAYERMAP_NONE)
            continue;
        rc = kvedge_adapter_apply(a, l, e->qk + (size_t)c * e->kvf_c, e->qv + (size_t)c * e->kvf_c,
                                  e->K, e->ak + (size_t)l * e->kvf_e, e->av + (size_t)l * e->kvf_e);
        if (rc == KVEDGE_ECORRUPT) /* not finite: the SLM computes the layer (adapter.h) */
            continue;
        if (rc != KVEDGE_OK)
            return rc;
        e->have[l] = true;
        adapted++;
    }
    s_src_t src = {e->ak, e->av, e->kvf_e, e->have};
    rc = s_session(e, e->es, doc, e->K, &src, doc + e->K, r);
    if (rc != KVEDGE_OK)
        return rc;
    e->acc[r].bytes += (double)bytes;
    e->acc[r].fp16_bytes += (double)f16;
    e->acc[r].adapted = adapted;
    e->acc[r].computed += Le - adapted;
    return KVEDGE_OK;
}

/* Every row of one document. */
static int s_document(s_ls_t *e, const int32_t *doc)
{
    const kvedge_lseval_opts_t *o = e->o;
    const int32_t *cont = doc + e->K;
    const uint32_t Le = e->ec->layers;
    /* cloud-only: the LLM's context K/V from its prefill, handed over in fp32 (bit-identical to
     * the session computing it, tests/clients/lab/test_eval.c). */
    int rc = kvedge_decoder_prefill(o->cloud, doc, e->K, NULL, e->ck, e->cv);
    s_src_t csrc = {e->ck, e->cv, e->kvf_c, NULL};
    if (rc == KVEDGE_OK)
        rc = s_session(e, e->cs, doc, e->K, &csrc, cont, 0);
    /* edge-only: the SLM computes its context itself (every layer a MISS). */
    memset(e->have, 0, Le * sizeof *e->have);
    s_src_t miss = {NULL, NULL, e->kvf_e, e->have};
    if (rc == KVEDGE_OK)
        rc = s_session(e, e->es, doc, e->K, &miss, cont, 1);
    /* peer-int8: the SLM's own context K/V through int8 blocks. */
    uint64_t bytes = 0, f16 = 0;
    if (rc == KVEDGE_OK)
        rc = kvedge_decoder_prefill(o->edge, doc, e->K, NULL, e->ek, e->ev);
    if (rc == KVEDGE_OK)
        rc = kvedge_lseval_roundtrip(e->ek, e->ev, Le, kvedge_decoder_kv_heads(e->o->edge), e->K,
                                     e->ec->head_dim, NULL, KVEDGE_SCHEME_INT8, e->ct, e->qk, e->qv,
                                     &bytes, &f16);
    s_src_t psrc = {e->qk, e->qv, e->kvf_e, NULL};
    if (rc == KVEDGE_OK)
        rc = s_session(e, e->es, doc, e->K, &psrc, cont, 2);
    if (rc == KVEDGE_OK) {
        e->acc[2].bytes += (double)bytes;
        e->acc[2].fp16_bytes += (double)f16;
    }
    size_t r = 3;
    for (size_t a = 0; rc == KVEDGE_OK && a < o->n_adapters; a++)
        for (int s = 0; rc == KVEDGE_OK && s < 3; s++, r++)
            rc = s_ce_row(e, r, o->adapters[a], s_ce_schemes[s], doc);
    /* no-context: the continuation alone, from position 0. */
    if (rc == KVEDGE_OK)
        rc = s_session(e, e->es, NULL, 0, NULL, cont, r);
    return rc;
}

static int s_check(const kvedge_lseval_opts_t *o)
{
    if (!o || !o->cloud || !o->edge || !o->docs || !o->doc_len || o->n_docs == 0 ||
        o->ctx_tokens == 0 || o->cont_tokens == 0 || o->n_adapters > KVEDGE_LSEVAL_MAX_ADAPTERS ||
        (o->n_adapters && !o->adapters) || o->chunk_tokens > KVEDGE_BLOCK_MAX_TOKENS)
        return KVEDGE_EINVAL;
    const kvedge_decoder_config_t *cc = kvedge_decoder_config(o->cloud);
    const kvedge_decoder_config_t *ec = kvedge_decoder_config(o->edge);
    if (cc->layers == 0 || ec->layers == 0 || cc->vocab != ec->vocab)
        return KVEDGE_EINVAL;
    for (size_t a = 0; a < o->n_adapters; a++) {
        int rc = kvedge_lseval_adapter_check(o->adapters[a], o->cloud, o->edge, NULL, 0);
        if (rc != KVEDGE_OK)
            return rc;
    }
    uint64_t need = (uint64_t)o->ctx_tokens + o->cont_tokens;
    if (need > cc->max_positions || need > ec->max_positions)
        return KVEDGE_ETOOBIG;
    return KVEDGE_OK;
}

int kvedge_lseval_run(const kvedge_lseval_opts_t *o, kvedge_lseval_result_t **out)
{
    if (!out)
        return KVEDGE_EINVAL;
    *out = NULL;
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
    s_ls_t *e = malloc(sizeof *e);
    if (!e)
        return KVEDGE_ENOMEM;
    rc = s_init(e, o);
    size_t n_used = 0, n_short = 0;
    double t0 = s_now_s();
    for (size_t d = 0; rc == KVEDGE_OK && d < o->n_docs; d++) {
        if (o->max_docs && n_used >= o->max_docs)
            break;
        if (!o->docs[d] || o->doc_len[d] < need) {
            n_short++;
            continue;
        }
        for (size_t t = 0; t < need && rc == KVEDGE_OK; t++)
            if (o->docs[d][t] < 0 || (uint32_t)o->docs[d][t] >= e->V)
                rc = KVEDGE_EINVAL;
        if (rc == KVEDGE_OK)
            rc = s_document(e, o->docs[d]);
        if (rc == KVEDGE_OK) {
            n_used++;
            if (o->progress)
                o->progress(o->progress_arg, n_used, d, s_now_s() - t0);
        }
    }
    kvedge_lseval_result_t *res = NULL;
    if (rc == KVEDGE_OK && !(res = calloc(1, sizeof *res)))
        rc = KVEDGE_ENOMEM;
    if (rc == KVEDGE_OK) {
        res->cloud_layers = e->cc->layers;
        res->edge_layers = e->ec->layers;
        res->ctx_tokens = e->K;
        res->cont_tokens = e->M;
        res->n_docs = n_used;
        res->n_short = n_short;
        res->seconds = s_now_s() - t0;
        res->n_rows = e->n_rows;
        for (size_t i = 0; i < e->n_rows; i++) {
            kvedge_lseval_row_t *r = &res->row[i];
            const s_acc_t *a = &e->acc[i];
            double n = (double)a->n, docs = n_used ? (double)n_used : 1;
            *r = e->row[i];
            r->positions = a->n;
            r->nll = a->n ? a->nll / n : NAN;
            r->ppl = exp(r->nll);
            r->agree_cloud = a->n ? (double)a->agree_cloud / n : NAN;
            r->agree_edge = a->n ? (double)a->agree_edge / n : NAN;
            r->kl = a->n ? a->kl / n : NAN;
            r->bytes = a->bytes / docs;
            r->fp16_bytes = a->fp16_bytes / docs;
            r->layers_adapted = a->adapted;
            r->layers_computed = a->computed;
        }
        *out = res;
    }
    s_free(e);
    free(e);
    return rc;
}

/* ---------------------------------------------------------------- printing */

static void s_json_num(FILE *f, const char *key, double x, bool comma)
{
    if (isfinite(x))
        fprintf(f, "\"%s\":%.9g%s", key, x, comma ? "," : "");
    else
        fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
}

void kvedge_lseval_print(FILE *f, const kvedge_lseval_result_t *r, bool json)
{
    if (!f || !r)
        return;
    if (json) {
        fprintf(f,
                "{\"cloud_layers\":%u,\"edge_layers\":%u,\"context_tokens\":%u,"
                "\"continuation_tokens\":%u,\"documents\":%zu,\"skipped_short\":%zu,",
                r->cloud_layers, r->edge_layers, r->ctx_tokens, r->cont_tokens, r->n_docs,
                r->n_short);
        s_json_num(f, "seconds", r->seconds, true);
        fprintf(f, "\"rows\":[");
        for (size_t i = 0; i < r->n_rows; i++) {
            const kvedge_lseval_row_t *x = &r->row[i];
            fprintf(f, "%s{\"name\":\"%s\",\"kind\":\"%s\",\"adapter\":", i ? "," : "", x->name,
                    kvedge_lseval_kind_name(x->kind));
            if (x->adapter >= 0)
                fprintf(f, "%d,", x->adapter);
            else
                fprintf(f, "null,");
            fprintf(f, "\"positions\":%llu,", (unsigned long long)x->positions);
            s_json_num(f, "nll", x->nll, true);
            s_json_num(f, "ppl", x->ppl, true);
            s_json_num(f, "agree_cloud", x->agree_cloud, true);
            s_json_num(f, "agree_edge", x->agree_edge, true);
            s_json_num(f, "kl", x->kl, true);
            s_json_num(f, "bytes", x->bytes, true);
            s_json_num(f, "fp16_bytes", x->fp16_bytes, true);
            fprintf(f, "\"layers_adapted\":%u,\"layers_computed\":%llu}", x->layers_adapted,
                    (unsigned long long)x->layers_computed);
        }
        fprintf(f, "]}\n");
        return;
    }
    fprintf(f,
            "%zu documents (%zu too short skipped), context %u tokens, continuation %u: %llu "
            "positions scored; cloud %u layers, edge %u layers; %.1f s\n",
            r->n_docs, r->n_short, r->ctx_tokens, r->cont_tokens,
            (unsigned long long)(r->n_rows ? r->row[0].positions : 0), r->cloud_layers,
            r->edge_layers, r->seconds);
    fprintf(f, "%-32s %9s %11s %10s %10s %12s %7s\n", "mode", "ppl", "agree-cloud", "agree-edge",
            "KL(cloud)", "ctx bytes", "/fp16");
    for (size_t i = 0; i < r->n_rows; i++) {
        const kvedge_lseval_row_t *x = &r->row[i];
        char note[48] = "", ratio[16] = "-";
        if (x->kind == KVEDGE_LSEVAL_CE_LSLM && x->layers_computed)
            snprintf(note, sizeof note, "  (%llu layers computed)",
                     (unsigned long long)x->layers_computed);
        if (x->fp16_bytes > 0)
            snprintf(ratio, sizeof ratio, "%.3f", x->bytes / x->fp16_bytes);
        fprintf(f, "%-32s %9.4f %11.4f %10.4f %10.4g %12.0f %7s%s\n", x->name, x->ppl,
                x->agree_cloud, x->agree_edge, x->kl, x->bytes, ratio, note);
    }
}

void kvedge_lseval_print_dat(FILE *f, const kvedge_lseval_result_t *r)
{
    if (!f || !r)
        return;
    fprintf(f, "# kvedge lseval: %zu documents, context %u, continuation %u\n", r->n_docs,
            r->ctx_tokens, r->cont_tokens);
    fprintf(f, "# index name ppl agree_cloud agree_edge kl bytes\n");
    for (size_t i = 0; i < r->n_rows; i++) {
        const kvedge_lseval_row_t *x = &r->row[i];
        char name[KVEDGE_LSEVAL_NAME_BYTES];
        snprintf(name, sizeof name, "%s", x->name);
        for (char *p = name; *p; p++)
            if (*p == ' ')
                *p = '_';
        fprintf(f, "%zu %s %.9g %.9g %.9g %.9g %.0f\n", i, name, x->ppl, x->agree_cloud,
                x->agree_edge, x->kl, x->bytes);
    }
}
