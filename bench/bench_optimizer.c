/* The cache optimizer's benchmark: TTFT and quality of each fixed precision and of the adaptive
 * choice under quality budgets, as the cloud link is swept (docs/benchmarks.md, "The cache
 * optimizer over a cloud link sweep").
 *
 * In this process: a Storage Master (it tells the proxy the model's shape), a cloud store node
 * holding every context as lossless fp16 blocks (the other rungs it derives, docs/protocol.md
 * "Precisions"), and per link rate a fresh edge proxy whose only source is that node behind an
 * emulated link, planning with the model's sensitivity profile (--quality). The edge decoder is
 * the trained cloud model (models/kjv/cloud) on this CPU.
 *
 * Rows: fixed precisions (the accept list is that one rung, no budget: the proxy may still
 * recompute a layer; with --basis DIR the node loads those coding bases and the transform-coded
 * rung tc is one of them) and the adaptive choice (accept lossless, int8, int4-g32, int4-g128, and
 * tc with --basis, under a KL budget). Per (rate, row):
 *  - TTFT: kvedge_e2e_decode through the proxy, with the decoder's time estimates (the plan may
 *    recompute layers), medians of --runs runs after a warm-up, rows interleaved;
 *  - quality: for each of --docs held-out documents, one FETCH of its context with the same
 *    accept list, budget and time estimates through the same proxy, the planned-recompute
 *    layers computed here, and the continuation scored with teacher forcing against the
 *    context's K/V computed here in fp32 (clients/lab/eval.h's measurement): perplexity change,
 *    mean KL(reference || row) and greedy agreement. The plan depends on the link, so quality
 *    is measured per rate.
 *
 *   bench_optimizer [--context 384] [--continuation 128] [--prompt 32] [--docs 48] [--runs 21]
 *                   [--budgets kl:1e-5,kl:2e-6] [--rates 10mbit,100mbit,1gbit,10gbit]
 *                   [--latency 10ms] [--no-think] [--no-keep-derived] [--fetch-only]
 *                   [--out DIR]
 *                   [--models DIR] [--quality FILE] [--basis DIR]
 *
 * Tables go to stdout (markdown); optimizer_ttft.dat, optimizer_quality.dat and optimizer_ppl.dat
 * go to --out (scripts/plot_optimizer.gp). */
#define _GNU_SOURCE /* nftw */
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/kvmsg.h"
#include "runtime/log.h"
#include "runtime/mview.h"
#include "bench/bench_common.h"
#include "clients/decoder/decoder.h"
#include "clients/e2e/e2e.h"
#include "clients/lab/eval.h"
#include "clients/lib/pipeline.h"
#include "proxy/proxy.h"
#include "proxy/quality.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "access/codec/prec.h"

#ifndef KVEDGE_BENCH_MODELS
#define KVEDGE_BENCH_MODELS "models"
#endif

#define S_MODEL_ID      "kjv-cloud"
#define S_HEADS         6 /* the trained model's attention heads (6 x 32) */
#define S_MAX_RATES     8
#define S_MAX_BUDGETS   4
#define S_MAX_ROWS      (6 + S_MAX_BUDGETS)
#define S_MAX_RUNS      50
#define S_MAX_DOCS      64
#define S_MAX_LAYERS    64
#define S_MAX_CHUNKS    8
#define S_RUNG_BYTES    12    /* a short rung name, "g128+t75" */
#define S_RTT_US        20000 /* the proxy's prior for a 10 ms one-way link */
#define S_DEADLINE_MS   120000
#define S_START_WAIT_MS 10000
#define S_NOISE         1.05 /* "no slower": ratios up to it count as equal (run-to-run noise) */

/* ---------------------------------------------------------------- options and state */

typedef struct {
    uint32_t ctx, cont, prompt, docs, runs;
    double bps[S_MAX_RATES];
    char rate[S_MAX_RATES][16];
    size_t nrates;
    kvedge_quality_metric_t metric[S_MAX_BUDGETS];
    double budget[S_MAX_BUDGETS];
    size_t nbudgets;
    char latency[16];
    bool think, keep_derived;
    bool fetch_only; /* no decoder times in the requests: the proxy fetches every layer */
    const char *out, *models, *quality;
    const char *basis; /* coding bases for the node (setting basis): adds the fixed row tc */
} s_cfg_t;

/* One row: the accept list (best first) and the budget it is planned under. */
typedef struct {
    char name[48];
    kvedge_prec_t accept[KVEDGE_PREC_MAX_ACCEPT];
    size_t n;
    kvedge_quality_metric_t metric;
    double budget;
    bool adaptive;
} s_row_t;

/* A measured (rate, row). */
typedef struct {
    double ttft[S_MAX_RUNS], plan_us[S_MAX_RUNS];
    uint64_t received;                                  /* bytes, last TTFT run */
    char rungs[S_MAX_RUNS][S_MAX_LAYERS][S_RUNG_BYTES]; /* each TTFT run's plan: rung per layer,
                                                "R": recomputed; the last run's is reported */
    uint32_t fetched;                                   /* layers fetched (last run) */
    double pred; /* the planner's quality sum of that plan (profile, row metric) */
    /* quality over the documents */
    double nll, kl;
    double doc_kl, doc_kl2; /* sums over documents of each one's mean KL, and of its square */
    uint64_t n, agree;
    double pred_max; /* largest predicted quality sum over the documents' plans */
    uint32_t same_plan;
} s_meas_t;

static s_cfg_t s_cfg;
static s_row_t s_rows[S_MAX_ROWS];
static size_t s_nrows;
static char s_root[] = "/tmp/kvedge-bopt-XXXXXX";
static bool s_have_root;
static kvedge_master_t *s_master;
static kvedge_mview_t *s_reg;
static kvedge_node_t *s_node;
static kvedge_proxy_t *s_proxy;
static kvedge_client_t *s_cloud, *s_edge;
static kvedge_decoder_t *s_dec;
static kvedge_model_t s_model;
static kvedge_quality_profile_t *s_prof;
static char s_node_ep[128];

static int s_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void s_cleanup(void)
{
    kvedge_client_destroy(&s_edge);
    kvedge_client_destroy(&s_cloud);
    kvedge_proxy_destroy(&s_proxy);
    kvedge_node_destroy(&s_node);
    kvedge_mview_destroy(&s_reg);
    kvedge_master_destroy(&s_master);
    kvedge_quality_destroy(&s_prof);
    kvedge_decoder_destroy(&s_dec);
    if (s_have_root)
        nftw(s_root, s_rm_one, 16, FTW_DEPTH | FTW_PHYS);
    s_have_root = false;
}

static void s_die(const char *what, int rc)
{
    fprintf(stderr, "bench_optimizer: %s: %s\n", what, rc ? kvedge_strerror(rc) : "failed");
    s_cleanup();
    exit(1);
}

static void s_check(int rc, const char *what)
{
    if (rc != 0)
        s_die(what, rc);
}

/* ---------------------------------------------------------------- documents */

typedef struct {
    int32_t *tok;
    size_t n;
} s_doc_t;

static s_doc_t s_docs[S_MAX_DOCS];
static size_t s_ndocs;
static s_doc_t s_ttft_doc; /* the TTFT request's context and prompt */

/* The held-out documents (whitespace-separated ids, blank lines between documents) long enough
 * for context + continuation + 1: the first one is the TTFT request's, the next --docs are
 * scored. */
static void s_read_docs(const char *path, uint32_t vocab)
{
    FILE *f = fopen(path, "r");
    if (!f)
        s_die(path, KVEDGE_EIO);
    size_t need = (size_t)s_cfg.ctx + s_cfg.cont + 1;
    if (need < (size_t)s_cfg.ctx + s_cfg.prompt + 1)
        need = (size_t)s_cfg.ctx + s_cfg.prompt + 1;
    size_t cap = 4096, n = 0;
    int32_t *cur = bench_alloc(cap * sizeof *cur);
    char line[1 << 16];
    bool more = true, have_ttft = false;
    while (more && s_ndocs < s_cfg.docs) {
        more = fgets(line, sizeof line, f) != NULL;
        char *p = more ? line : (char *)"";
        bool blank = true;
        for (char *e; *p; p = e) {
            long v = strtol(p, &e, 10);
            if (e == p) {
                e = p + 1;
                continue;
            }
            blank = false;
            if (v < 0 || (uint32_t)v >= vocab)
                s_die("a token id outside the vocabulary", KVEDGE_EINVAL);
            if (n == cap) {
                int32_t *grown = realloc(cur, (cap *= 2) * sizeof *cur);
                if (!grown)
                    s_die("documents", KVEDGE_ENOMEM);
                cur = grown;
            }
            cur[n++] = (int32_t)v;
        }
        if ((blank || !more) && n) {
            if (n >= need) {
                s_doc_t d = {bench_alloc(n * sizeof(int32_t)), n};
                memcpy(d.tok, cur, n * sizeof *cur);
                if (!have_ttft)
                    s_ttft_doc = d;
                else
                    s_docs[s_ndocs++] = d;
                have_ttft = true;
            }
            n = 0;
        }
    }
    free(cur);
    fclose(f);
    if (!have_ttft || s_ndocs == 0)
        s_die("no held-out document is long enough", KVEDGE_EINVAL);
}

/* ---------------------------------------------------------------- the deployment */

static void s_register_model(void)
{
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len = 0;
    s_check(kvedge_master_model_pack(&s_model, body, &len), "model record");
    s_check(kvedge_mview_set(s_reg, "model/" S_MODEL_ID, body, len, S_START_WAIT_MS),
            "register the model");
}

static void s_start(void)
{
    char ep[128], pub[128], dir[128], why[512] = "";
    snprintf(ep, sizeof ep, "ipc://%s/master.sock", s_root);
    snprintf(pub, sizeof pub, "ipc://%s/master-pub.sock", s_root);
    snprintf(dir, sizeof dir, "%s/master", s_root);
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = ep;
    mo.pub = pub;
    mo.data_dir = dir;
    mo.insecure = true;
    if (kvedge_master_start(&mo, &s_master, why, sizeof why) != 0)
        s_die(why, 0);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = ep;
    vo.pub = pub;
    vo.prefix = "model/";
    s_check(kvedge_mview_start(&vo, &s_reg), "master view");
    s_register_model();

    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    ns.derive = true;
    ns.keep_derived = s_cfg.keep_derived;
    snprintf(s_node_ep, sizeof s_node_ep, "ipc://%s/cloud.sock", s_root);
    snprintf(ns.data, sizeof ns.data, "%s/cloud", s_root);
    snprintf(ns.bind, sizeof ns.bind, "%s", s_node_ep);
    snprintf(ns.name, sizeof ns.name, "cloud");
    if (s_cfg.basis) /* registered in this process: the edge decodes what the node codes */
        snprintf(ns.basis, sizeof ns.basis, "%s", s_cfg.basis);
    if (kvedge_node_start(&ns, &s_node, why, sizeof why) != 0)
        s_die(why, 0);
}

static kvedge_client_t *s_connect(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = S_DEADLINE_MS;
    kvedge_client_t *c = NULL;
    s_check(kvedge_client_connect(&o, &c), ep);
    return c;
}

/* A fresh edge proxy whose only source is the cloud node behind the emulated link of rate i. */
static void s_proxy_start(size_t i)
{
    char spec[400], ep[128], mep[128], mpub[128], why[512] = "";
    snprintf(spec, sizeof spec, "cloud cloud1 %s link=%s,%s bw=%.0f rtt=%d", s_node_ep,
             s_cfg.rate[i], s_cfg.latency, s_cfg.bps[i] / 8, S_RTT_US);
    snprintf(ep, sizeof ep, "ipc://%s/proxy-%zu.sock", s_root, i);
    snprintf(mep, sizeof mep, "ipc://%s/master.sock", s_root);
    snprintf(mpub, sizeof mpub, "ipc://%s/master-pub.sock", s_root);
    kvedge_proxy_source_t src;
    if (kvedge_proxy_source_parse(spec, &src) != 0)
        s_die(spec, KVEDGE_EINVAL);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = ep;
    po.insecure = true;
    po.id = "proxy";
    po.sources = &src;
    po.nsources = 1;
    po.master = mep;
    po.master_pub = mpub;
    po.metrics = "off";
    po.quality = s_cfg.quality;
    if (kvedge_proxy_start(&po, &s_proxy, why, sizeof why) != 0)
        s_die(why, 0);
    s_check(kvedge_proxy_wait_sources(s_proxy, 1, S_START_WAIT_MS), "proxy sources");
    s_edge = s_connect(ep);
}

static void s_proxy_stop(void)
{
    kvedge_client_destroy(&s_edge);
    kvedge_proxy_destroy(&s_proxy);
}

/* The cloud prefill of a context as lossless fp16 (pinned; not timed). */
static void s_prefill(const int32_t *ctx)
{
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    q.scheme = KVEDGE_SCHEME_LOSSLESS;
    q.dtype = KVEDGE_DTYPE_FP16;
    q.pin = true;
    kvedge_chunk_id_t ids[S_MAX_CHUNKS];
    s_check(kvedge_e2e_prefill(s_cloud, s_dec, &s_model, ctx, s_cfg.ctx, 0, &q, ids, S_MAX_CHUNKS,
                               NULL),
            "cloud prefill");
}

/* ---------------------------------------------------------------- rows and plans */

static void s_rows_make(void)
{
    static const char *const fixed[] = {"lossless", "int8", "int4-g32", "int4-g128",
                                        "int4-g32+think-75"};
    const size_t nf = s_cfg.think ? 5 : 4;
    for (size_t i = 0; i < nf + (s_cfg.basis ? 1 : 0); i++) {
        const char *name = i < nf ? fixed[i] : "tc"; /* the coded rung, with --basis */
        s_row_t *r = &s_rows[s_nrows++];
        snprintf(r->name, sizeof r->name, "%s", name);
        s_check(kvedge_prec_parse(name, &r->accept[0]), name);
        r->n = 1;
        r->metric = KVEDGE_QUALITY_NONE;
    }
    for (size_t b = 0; b < s_cfg.nbudgets; b++) {
        s_row_t *r = &s_rows[s_nrows++];
        snprintf(r->name, sizeof r->name, "adaptive %s:%g",
                 kvedge_quality_metric_name(s_cfg.metric[b]), s_cfg.budget[b]);
        /* With --basis the adaptive rows may choose tc too (the profile's tc row prices it). */
        s_check(kvedge_prec_list_parse(s_cfg.basis ? "lossless,int8,int4-g32,int4-g128,tc"
                                                   : "lossless,int8,int4-g32,int4-g128",
                                       r->accept, KVEDGE_PREC_MAX_ACCEPT, &r->n),
                "accept list");
        r->metric = s_cfg.metric[b];
        r->budget = s_cfg.budget[b];
        r->adaptive = true;
    }
}

/* A plan's rung per layer ("R": recomputed) and its quality sum under the profile (KL for
 * fixed rows, the row's metric for adaptive ones). */
static double s_plan_rungs(const kvedge_fetch_plan_t *p, uint32_t L, kvedge_quality_metric_t m,
                           char rungs[][S_RUNG_BYTES], uint32_t *fetched)
{
    double sum = 0;
    *fetched = 0;
    for (uint32_t l = 0; l < L; l++) {
        const char *name = "R";
        if (p->layer[l].source >= 0) {
            kvedge_prec_t r = (kvedge_prec_t)p->layer[l].prec;
            name = kvedge_prec_name(r);
            double c = 0;
            if (kvedge_quality_cost(s_prof, l, r, m == KVEDGE_QUALITY_NONE ? KVEDGE_QUALITY_KL : m,
                                    &c) == 0)
                sum += c;
            else
                sum = INFINITY;
            (*fetched)++;
        }
        /* short names for the table: "g32" for int4-g32, "g32+t75" for int4-g32+think-75 */
        if (strncmp(name, "int4-", 5) == 0)
            name += 5;
        char buf[24];
        snprintf(buf, sizeof buf, "%s", name);
        char *t = strstr(buf, "+think-");
        if (t)
            memmove(t + 2, t + 7, strlen(t + 7) + 1), t[1] = 't';
        snprintf(rungs[l], S_RUNG_BYTES, "%.11s", buf);
    }
    return sum;
}

static bool s_same_rungs(char a[][S_RUNG_BYTES], char b[][S_RUNG_BYTES], uint32_t L)
{
    for (uint32_t l = 0; l < L; l++)
        if (strcmp(a[l], b[l]) != 0)
            return false;
    return true;
}

/* ---------------------------------------------------------------- TTFT */

/* One TTFT request of row r (prompt variant k); retries while the proxy has not yet learnt
 * the model from the master. */
static void s_ttft(const s_row_t *r, uint32_t k, kvedge_e2e_result_t *res)
{
    const uint32_t P = s_cfg.prompt;
    int32_t tok[1];
    kvedge_e2e_request_t req;
    memset(&req, 0, sizeof req);
    req.mode = KVEDGE_E2E_KVEDGE;
    req.decoder = s_dec;
    req.ctx = s_ttft_doc.tok;
    req.ctx_len = s_cfg.ctx;
    /* prompts: successive windows of the document's continuation (each request its own) */
    size_t room = s_ttft_doc.n - s_cfg.ctx - P; /* >= 1: s_read_docs keeps longer ones */
    size_t off = s_cfg.ctx + ((size_t)k * 7) % room;
    req.prompt = s_ttft_doc.tok + off;
    req.prompt_len = P;
    req.max_new = 1;
    req.proxy = s_edge;
    req.model = &s_model;
    req.plan_recompute = !s_cfg.fetch_only;
    req.deadline_ms = S_DEADLINE_MS;
    req.accept = r->accept;
    req.n_accept = r->n;
    req.quality_metric = r->metric;
    req.quality_budget = r->budget;
    double until = bench_now_s() + S_START_WAIT_MS / 1e3;
    int rc;
    while ((rc = kvedge_e2e_decode(&req, tok, res)) == KVEDGE_ENOMODEL && bench_now_s() < until)
        usleep(200000);
    s_check(rc, r->name);
}

/* ---------------------------------------------------------------- quality */

typedef struct {
    const float *k, *v;
    size_t kvf;
    const bool *resident;
} s_prov_t;

static int s_prov(void *arg, uint32_t layer, float *k, float *v)
{
    const s_prov_t *p = arg;
    if (!p->resident || !p->resident[layer])
        return KVEDGE_DECODER_MISS;
    memcpy(k, p->k + layer * p->kvf, p->kvf * sizeof(float));
    memcpy(v, p->v + layer * p->kvf, p->kvf * sizeof(float));
    return KVEDGE_OK;
}

/* The reference of one document: its logits computed with the context's K/V computed here in
 * fp32, and their log-sum-exp and arg-max per scored position. */
typedef struct {
    float *logits; /* [cont][vocab] */
    double *lse;
    int32_t *arg;
    double nll;
} s_ref_t;

static s_ref_t s_refs[S_MAX_DOCS];
static double s_ref_nll;
static uint64_t s_ref_n;

/* Teacher-forced continuation of document d over the provider's context; ref NULL: the
 * reference run, kept in s_refs[d]; else scored into m. */
static void s_session(kvedge_decoder_session_t *sess, size_t d, s_prov_t *prov, s_meas_t *m,
                      float *x)
{
    const uint32_t V = kvedge_decoder_config(s_dec)->vocab, M = s_cfg.cont;
    const int32_t *doc = s_docs[d].tok, *cont = doc + s_cfg.ctx;
    s_ref_t *ref = &s_refs[d];
    for (uint32_t i = 0; i < M; i++) {
        float *out = m ? x : ref->logits + (size_t)i * V;
        int rc = i == 0 ? kvedge_decoder_session_begin(sess, doc, s_cfg.ctx, s_prov, prov, cont, 1,
                                                       M - 1, out)
                        : kvedge_decoder_session_step(sess, cont[i], out);
        s_check(rc, "teacher-forced session");
        int32_t arg;
        double lse = kvedge_eval_lse(out, V, &arg), nll = lse - out[cont[i + 1]];
        if (!m) {
            ref->lse[i] = lse;
            ref->arg[i] = arg;
            s_ref_nll += nll;
            s_ref_n++;
            continue;
        }
        const float *r = ref->logits + (size_t)i * V;
        double kl = 0;
        for (uint32_t t = 0; t < V; t++) {
            double lr = (double)r[t] - ref->lse[i], lq = (double)out[t] - lse;
            kl += exp(lr) * (lr - lq);
        }
        m->nll += nll;
        m->kl += kl > 0 ? kl : 0;
        m->n++;
        m->agree += arg == ref->arg[i];
    }
}

/* One FETCH of document d's context for row r through the proxy, with the decoder's
 * estimates (as kvedge_e2e_decode gives them), into k, v; resident[l] says which layers
 * arrived (the others were planned as recompute or missed). *plan receives the plan. */
static void s_fetch_doc(const s_row_t *r, size_t d, float *k, float *v, bool *resident,
                        kvedge_fetch_plan_t *plan)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(s_dec);
    const uint32_t L = c->layers, K = s_cfg.ctx, ct = KVEDGE_E2E_CHUNK_TOKENS_DEFAULT;
    const size_t kvf = kvedge_decoder_kv_floats(s_dec, K);
    kvedge_chunk_id_t ids[S_MAX_CHUNKS];
    size_t nids = 0;
    s_check(kvedge_e2e_chunks(&s_model, s_docs[d].tok, K, ct, ids, S_MAX_CHUNKS, &nids), "chunks");
    float cu1 = 0, ru1 = 0, cu[S_MAX_LAYERS], ru[S_MAX_LAYERS];
    s_check(kvedge_decoder_estimate(s_dec, K, s_cfg.prompt, &cu1, &ru1), "estimate");
    kvedge_kv_dst_t kd[S_MAX_LAYERS], vd[S_MAX_LAYERS];
    for (uint32_t l = 0; l < L; l++) {
        cu[l] = cu1;
        ru[l] = ru1;
        kvedge_kv_dst_t t = {.layout = KVEDGE_KV_CONTIG,
                             .dtype = KVEDGE_DTYPE_FP32,
                             .base = k + l * kvf,
                             .cap_bytes = kvf * sizeof(float),
                             .heads = c->heads,
                             .head_dim = c->head_dim,
                             .tokens_cap = K};
        kd[l] = t;
        t.base = v + l * kvf;
        vd[l] = t;
    }
    kvedge_pipeline_opts_t o = {.size = sizeof(kvedge_pipeline_opts_t),
                                .client = s_edge,
                                .model = &s_model,
                                .chunks = ids,
                                .n_chunks = nids,
                                .chunk_tokens = ct,
                                .tokens = K,
                                .layers = (uint16_t)L,
                                .k = kd,
                                .v = vd,
                                .slot_bytes = kvedge_e2e_slot_bytes(K, ct, c->heads, c->head_dim),
                                .compute_us = s_cfg.fetch_only ? NULL : cu,
                                .recompute_us = s_cfg.fetch_only ? NULL : ru,
                                .deadline_ms = S_DEADLINE_MS,
                                .accept = r->accept,
                                .n_accept = r->n,
                                .quality_metric = r->metric,
                                .quality_budget = r->budget};
    kvedge_pipeline_t *pipe = NULL;
    s_check(kvedge_pipeline_open(&o, &pipe), "quality fetch");
    for (uint32_t l = 0; l < L; l++) {
        int rc = kvedge_pipeline_wait(pipe, (uint16_t)l);
        if (rc != 0 && rc != KVEDGE_ENOTFOUND) {
            kvedge_pipeline_destroy(&pipe);
            s_die("quality fetch: layer", rc);
        }
        resident[l] = rc == 0;
    }
    int prc = kvedge_pipeline_plan(pipe, plan);
    kvedge_pipeline_destroy(&pipe);
    s_check(prc, "quality fetch: plan");
}

/* ---------------------------------------------------------------- the sweep */

static const char *s_fmt_kl(double v, char *buf, size_t len)
{
    if (v == 0)
        snprintf(buf, len, "0");
    else if (isinf(v))
        snprintf(buf, len, "inf");
    else
        snprintf(buf, len, "%.2e", v);
    return buf;
}

static void s_run(void)
{
    const kvedge_decoder_config_t *c = kvedge_decoder_config(s_dec);
    const uint32_t L = c->layers, V = c->vocab;
    const size_t kvf = kvedge_decoder_kv_floats(s_dec, s_cfg.ctx);
    float *k = bench_alloc(L * kvf * sizeof *k), *v = bench_alloc(L * kvf * sizeof *v);
    float *x = bench_alloc(V * sizeof *x);
    kvedge_decoder_session_t *sess = kvedge_decoder_session_new(s_dec);
    if (!sess)
        s_die("session", KVEDGE_ENOMEM);
    kvedge_e2e_result_t *res = bench_alloc(sizeof *res);
    kvedge_fetch_plan_t *plan = bench_alloc(sizeof *plan);
    s_meas_t(*meas)[S_MAX_ROWS] = bench_alloc(s_cfg.nrates * sizeof *meas);
    memset(meas, 0, s_cfg.nrates * sizeof *meas);

    /* References: every document's continuation over its context computed here in fp32. */
    double t0 = bench_now_s();
    for (size_t d = 0; d < s_ndocs; d++) {
        s_refs[d].logits = bench_alloc((size_t)s_cfg.cont * V * sizeof(float));
        s_refs[d].lse = bench_alloc(s_cfg.cont * sizeof(double));
        s_refs[d].arg = bench_alloc(s_cfg.cont * sizeof(int32_t));
        s_prov_t none = {NULL, NULL, kvf, NULL};
        s_session(sess, d, &none, NULL, NULL);
    }
    const double ref_ppl = exp(s_ref_nll / (double)s_ref_n);
    fprintf(stderr, "bench_optimizer: references of %zu documents, %.1f s\n", s_ndocs,
            bench_now_s() - t0);

    float cu = 0, ru = 0;
    s_check(kvedge_decoder_estimate(s_dec, s_cfg.ctx, s_cfg.prompt, &cu, &ru), "estimate");
    if (s_cfg.fetch_only)
        printf("Fetch only (--fetch-only): the requests carry no decoder times, so the proxy "
               "fetches every layer and the precision is the only lever.\n\n");
    printf("Decoder estimates at start (context %u, prompt %u): %.2f ms per layer over the "
           "prompt, %.2f ms more to compute a layer's context K/V, %u layers. Reference "
           "perplexity (fp32, context recomputed) over %llu positions: %.4f.\n\n",
           s_cfg.ctx, s_cfg.prompt, cu / 1e3, ru / 1e3, L, (unsigned long long)s_ref_n, ref_ppl);

    for (size_t ri = 0; ri < s_cfg.nrates; ri++) {
        double tr = bench_now_s();
        s_proxy_start(ri);
        /* TTFT: a warm-up of every row (the proxy learns its link, the node derives and keeps
         * the rungs), then --runs rounds with the rows interleaved. */
        for (size_t r = 0; r < s_nrows; r++)
            s_ttft(&s_rows[r], 0, res);
        for (uint32_t k2 = 0; k2 < s_cfg.runs; k2++)
            for (size_t r = 0; r < s_nrows; r++) {
                s_meas_t *m = &meas[ri][r];
                s_ttft(&s_rows[r], 1 + k2, res);
                m->ttft[k2] = res->ttft_us / 1e3;
                m->plan_us[k2] = res->have_plan ? res->plan.total_us / 1e3 : NAN;
                uint32_t fetched = 0;
                double pred = res->have_plan ? s_plan_rungs(&res->plan, L, s_rows[r].metric,
                                                            m->rungs[k2], &fetched)
                                             : NAN;
                m->fetched = fetched;
                m->pred = pred;
                m->received = res->received_bytes;
            }
        /* Quality: every document fetched with the row's request, then scored. */
        for (size_t r = 0; r < s_nrows; r++) {
            s_meas_t *m = &meas[ri][r];
            for (size_t d = 0; d < s_ndocs; d++) {
                bool resident[S_MAX_LAYERS];
                s_fetch_doc(&s_rows[r], d, k, v, resident, plan);
                char rungs[S_MAX_LAYERS][S_RUNG_BYTES];
                uint32_t fetched = 0;
                double pred = s_plan_rungs(plan, L, s_rows[r].metric, rungs, &fetched);
                if (pred > m->pred_max || d == 0)
                    m->pred_max = pred;
                m->same_plan += s_same_rungs(rungs, m->rungs[s_cfg.runs - 1], L);
                s_prov_t p = {k, v, kvf, resident};
                double kl0 = m->kl;
                uint64_t n0 = m->n;
                s_session(sess, d, &p, m, x);
                double dk = (m->kl - kl0) / (double)(m->n - n0);
                m->doc_kl += dk;
                m->doc_kl2 += dk * dk;
            }
        }
        s_proxy_stop();
        fprintf(stderr, "bench_optimizer: %s done in %.1f s\n", s_cfg.rate[ri], bench_now_s() - tr);

        /* The table of this rate. */
        printf("#### Cloud link %s, %s one way\n\n", s_cfg.rate[ri], s_cfg.latency);
        printf("| row | accept | budget | rungs per layer 0..%u (R: recomputed) | TTFT ms | plan T "
               "ms | received MB | KL predicted: TTFT plan / max over documents | KL measured ± "
               "s.e. | ppl change %% | agreement | "
               "budget met |\n|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
               L - 1);
        for (size_t r = 0; r < s_nrows; r++) {
            const s_row_t *row = &s_rows[r];
            s_meas_t *m = &meas[ri][r];
            char acc[96] = "", rs[S_MAX_LAYERS * 9] = "", bud[32] = "none", a[24], a2[24], b[24];
            for (size_t i = 0; i < row->n; i++)
                snprintf(acc + strlen(acc), sizeof acc - strlen(acc), "%s%s", i ? "," : "",
                         kvedge_prec_name(row->accept[i]));
            char(*last)[S_RUNG_BYTES] = m->rungs[s_cfg.runs - 1];
            uint32_t stable = 0;
            for (uint32_t k2 = 0; k2 < s_cfg.runs; k2++)
                stable += s_same_rungs(m->rungs[k2], last, L);
            for (uint32_t l = 0; l < L; l++)
                snprintf(rs + strlen(rs), sizeof rs - strlen(rs), "%s%s", l ? " " : "", last[l]);
            char note[96] = "";
            if (stable < s_cfg.runs || m->same_plan < s_ndocs)
                snprintf(note, sizeof note, " (TTFT runs %u/%u, documents %u/%zu)", stable,
                         s_cfg.runs, m->same_plan, s_ndocs);
            if (row->adaptive)
                snprintf(bud, sizeof bud, "%s:%g", kvedge_quality_metric_name(row->metric),
                         row->budget);
            double kl = m->kl / (double)m->n;
            /* the standard error of the mean KL over documents (documents score equally many
             * positions, so the mean of their means is kl) */
            double dm = m->doc_kl / (double)s_ndocs,
                   var = s_ndocs > 1 ? (m->doc_kl2 - s_ndocs * dm * dm) / (double)(s_ndocs - 1) : 0,
                   se = sqrt(var > 0 ? var : 0) / sqrt((double)s_ndocs);
            char sek[24];
            double ppl = exp(m->nll / (double)m->n);
            char met[96] = "-";
            if (row->adaptive)
                snprintf(met, sizeof met, "%s (predicted %s)",
                         kl <= row->budget ? "**yes**" : "**no**",
                         m->pred_max <= row->budget ? "yes" : "no");
            printf("| %s | %s | %s | %s%s | %.1f | %.1f | %.3f | %s / %s | %s ± %s | %+.4f | %.4f "
                   "| %s "
                   "|\n",
                   row->name, acc, bud, rs, note, bench_median(m->ttft, s_cfg.runs),
                   bench_median(m->plan_us, s_cfg.runs), (double)m->received / 1e6,
                   s_fmt_kl(m->pred, a2, sizeof a2), s_fmt_kl(m->pred_max, a, sizeof a),
                   s_fmt_kl(kl, b, sizeof b), s_fmt_kl(se, sek, sizeof sek),
                   (ppl / ref_ppl - 1) * 100, (double)m->agree / (double)m->n, met);
        }
        /* The goals of each budget at this rate. */
        for (size_t r = 0; r < s_nrows; r++) {
            const s_row_t *row = &s_rows[r];
            if (!row->adaptive)
                continue;
            double best = INFINITY, t = bench_median(meas[ri][r].ttft, s_cfg.runs);
            const char *best_name = "none";
            for (size_t f = 0; f < s_nrows; f++) {
                const s_meas_t *m = &meas[ri][f];
                double tf = bench_median(m->ttft, s_cfg.runs);
                if (!s_rows[f].adaptive && m->kl / (double)m->n <= row->budget && tf < best) {
                    best = tf;
                    best_name = s_rows[f].name;
                }
            }
            const s_meas_t *m = &meas[ri][r];
            bool within = m->kl / (double)m->n <= row->budget;
            printf("\n%s: TTFT %.1f ms vs the best fixed row within the budget (%s, %.1f ms): "
                   "ratio %.2f, goal (<= %.2f) **%s**; budget %s.",
                   row->name, t, best_name, best, t / best, S_NOISE,
                   t <= S_NOISE * best ? "met" : "missed", within ? "met" : "**exceeded**");
        }
        printf("\n\n");
        fflush(stdout);
    }

    /* Data files for scripts/plot_optimizer.gp. */
    for (int what = 0; what < 3; what++) {
        static const char *const file[] = {"optimizer_ttft.dat", "optimizer_quality.dat",
                                           "optimizer_ppl.dat"};
        static const char *const desc[] = {"TTFT ms, medians", "mean KL (nats) vs recomputation",
                                           "perplexity change % vs recomputation"};
        char path[600];
        snprintf(path, sizeof path, "%s/%s", s_cfg.out, file[what]);
        FILE *f = fopen(path, "w");
        if (!f)
            s_die(path, KVEDGE_EIO);
        fprintf(f, "# cloud link bits/s, label, per row: ");
        fputs(desc[what], f);
        fprintf(f, "; then the budgets\n# rows %zu budgets %zu\nbps label", s_nrows,
                s_cfg.nbudgets);
        for (size_t r = 0; r < s_nrows; r++)
            fprintf(f, " \"%s\"", s_rows[r].name);
        for (size_t b = 0; b < s_cfg.nbudgets; b++)
            fprintf(f, " \"budget %s:%g\"", kvedge_quality_metric_name(s_cfg.metric[b]),
                    s_cfg.budget[b]);
        fprintf(f, "\n");
        for (size_t ri = 0; ri < s_cfg.nrates; ri++) {
            fprintf(f, "%.0f \"%s\"", s_cfg.bps[ri], s_cfg.rate[ri]);
            for (size_t r = 0; r < s_nrows; r++) {
                const s_meas_t *m = &meas[ri][r];
                double val = what == 0   ? bench_median(m->ttft, s_cfg.runs)
                             : what == 1 ? m->kl / (double)m->n
                                         : (exp(m->nll / (double)m->n) / ref_ppl - 1) * 100;
                fprintf(f, " %.6g", val);
            }
            for (size_t b = 0; b < s_cfg.nbudgets; b++)
                fprintf(f, " %.6g", s_cfg.budget[b]);
            fprintf(f, "\n");
        }
        fclose(f);
    }
    for (size_t d = 0; d < s_ndocs; d++) {
        free(s_refs[d].logits);
        free(s_refs[d].lse);
        free(s_refs[d].arg);
    }
    kvedge_decoder_session_destroy(&sess);
    free(meas);
    free(plan);
    free(res);
    free(x);
    free(v);
    free(k);
}

/* ---------------------------------------------------------------- main */

/* "10mbit", "1gbit", "500kbit": bits per second. */
static bool s_rate_parse(const char *s, double *bps)
{
    char *end;
    double v = strtod(s, &end);
    double mul = strcmp(end, "kbit") == 0   ? 1e3
                 : strcmp(end, "mbit") == 0 ? 1e6
                 : strcmp(end, "gbit") == 0 ? 1e9
                                            : 0;
    *bps = v * mul;
    return end != s && mul > 0 && v > 0 && strlen(s) < 16;
}

static void s_usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--context 384] [--continuation 128] [--prompt 32] [--docs 48]\n"
            "          [--runs 21] [--budgets kl:1e-5,kl:2e-6]\n"
            "          [--rates 10mbit,100mbit,1gbit,10gbit] [--latency 10ms] [--no-think]\n"
            "          [--no-keep-derived] [--fetch-only] [--out DIR]\n"
            "          [--models DIR (default %s)]\n"
            "          [--quality FILE (default MODELS/kjv/cloud/quality.json)]\n"
            "          [--basis DIR (coding bases: adds the fixed row tc)]\n",
            argv0, KVEDGE_BENCH_MODELS);
    exit(2);
}

static void s_options(int argc, char **argv)
{
    enum {
        O_CTX = 1000,
        O_CONT,
        O_PROMPT,
        O_DOCS,
        O_RUNS,
        O_BUDGETS,
        O_RATES,
        O_LAT,
        O_NOTHINK,
        O_NOKEEP,
        O_OUT,
        O_MODELS,
        O_QUALITY,
        O_FETCHONLY,
        O_BASIS
    };
    static const struct option opts[] = {{"context", required_argument, NULL, O_CTX},
                                         {"continuation", required_argument, NULL, O_CONT},
                                         {"prompt", required_argument, NULL, O_PROMPT},
                                         {"docs", required_argument, NULL, O_DOCS},
                                         {"runs", required_argument, NULL, O_RUNS},
                                         {"budgets", required_argument, NULL, O_BUDGETS},
                                         {"rates", required_argument, NULL, O_RATES},
                                         {"latency", required_argument, NULL, O_LAT},
                                         {"no-think", no_argument, NULL, O_NOTHINK},
                                         {"no-keep-derived", no_argument, NULL, O_NOKEEP},
                                         {"fetch-only", no_argument, NULL, O_FETCHONLY},
                                         {"out", required_argument, NULL, O_OUT},
                                         {"models", required_argument, NULL, O_MODELS},
                                         {"quality", required_argument, NULL, O_QUALITY},
                                         {"basis", required_argument, NULL, O_BASIS},
                                         {NULL, 0, NULL, 0}};
    s_cfg.ctx = 384;
    s_cfg.cont = 128;
    s_cfg.prompt = 32;
    s_cfg.docs = 48; /* every held-out chapter long enough at the defaults, after the TTFT one */
    s_cfg.runs = 21;
    s_cfg.think = s_cfg.keep_derived = true;
    s_cfg.out = ".";
    s_cfg.models = KVEDGE_BENCH_MODELS;
    snprintf(s_cfg.latency, sizeof s_cfg.latency, "10ms");
    const char *budgets = "kl:1e-5,kl:2e-6", *rates = "10mbit,100mbit,1gbit,10gbit";
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        long v = 0;
        if (o >= O_CTX && o <= O_RUNS) {
            v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > 4096)
                s_usage(argv[0]);
        }
        switch (o) {
        case O_CTX:
            s_cfg.ctx = (uint32_t)v;
            break;
        case O_CONT:
            s_cfg.cont = (uint32_t)v;
            break;
        case O_PROMPT:
            s_cfg.prompt = (uint32_t)v;
            break;
        case O_DOCS:
            if (v > S_MAX_DOCS)
                s_usage(argv[0]);
            s_cfg.docs = (uint32_t)v;
            break;
        case O_RUNS:
            if (v > S_MAX_RUNS)
                s_usage(argv[0]);
            s_cfg.runs = (uint32_t)v;
            break;
        case O_BUDGETS:
            budgets = optarg;
            break;
        case O_RATES:
            rates = optarg;
            break;
        case O_LAT:
            snprintf(s_cfg.latency, sizeof s_cfg.latency, "%s", optarg);
            break;
        case O_NOTHINK:
            s_cfg.think = false;
            break;
        case O_NOKEEP:
            s_cfg.keep_derived = false;
            break;
        case O_FETCHONLY:
            s_cfg.fetch_only = true;
            break;
        case O_OUT:
            s_cfg.out = optarg;
            break;
        case O_MODELS:
            s_cfg.models = optarg;
            break;
        case O_QUALITY:
            s_cfg.quality = optarg;
            break;
        case O_BASIS:
            s_cfg.basis = optarg;
            break;
        default:
            s_usage(argv[0]);
        }
    }
    if (optind != argc)
        s_usage(argv[0]);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", budgets);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (s_cfg.nbudgets == S_MAX_BUDGETS ||
            kvedge_quality_budget_parse(t, &s_cfg.metric[s_cfg.nbudgets],
                                        &s_cfg.budget[s_cfg.nbudgets]) != 0 ||
            s_cfg.metric[s_cfg.nbudgets] == KVEDGE_QUALITY_NONE)
            s_usage(argv[0]);
        s_cfg.nbudgets++;
    }
    snprintf(buf, sizeof buf, "%s", rates);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (s_cfg.nrates == S_MAX_RATES || !s_rate_parse(t, &s_cfg.bps[s_cfg.nrates]))
            s_usage(argv[0]);
        snprintf(s_cfg.rate[s_cfg.nrates++], 16, "%s", t);
    }
    if (s_cfg.nrates == 0)
        s_usage(argv[0]);
}

static void s_on_signal(int sig)
{
    (void)sig;
    _exit(128 + sig); /* temporary files under /tmp/kvedge-bopt-* stay behind */
}

int main(int argc, char **argv)
{
    s_options(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, s_on_signal);
    signal(SIGTERM, s_on_signal);
    kvedge_log_set_level(KVEDGE_LOG_ERROR);
    if (mkdir(s_cfg.out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_optimizer: cannot create %s\n", s_cfg.out);
        return 1;
    }
    static char quality[600], weights[600], ids[600];
    if (!s_cfg.quality) {
        snprintf(quality, sizeof quality, "%s/kjv/cloud/quality.json", s_cfg.models);
        s_cfg.quality = quality;
    }
    snprintf(weights, sizeof weights, "%s/kjv/cloud/model.safetensors", s_cfg.models);
    snprintf(ids, sizeof ids, "%s/kjv/heldout.ids", s_cfg.models);
    if (!mkdtemp(s_root))
        return 1;
    s_have_root = true;
    double t_start = bench_now_s();

    s_dec = kvedge_decoder_new();
    if (!s_dec)
        s_die("decoder", KVEDGE_ENOMEM);
    if (kvedge_decoder_load(s_dec, weights, S_HEADS) != 0) {
        fprintf(stderr, "bench_optimizer: %s: %s\n", weights, kvedge_decoder_error(s_dec));
        s_die("load", KVEDGE_EINVAL);
    }
    const kvedge_decoder_config_t *c = kvedge_decoder_config(s_dec);
    if (s_cfg.ctx + s_cfg.cont > c->max_positions ||
        s_cfg.ctx + s_cfg.prompt + 1 > c->max_positions) {
        fprintf(stderr,
                "bench_optimizer: context %u + continuation %u (or + prompt %u + 1) is over the "
                "model's %u positions\n",
                s_cfg.ctx, s_cfg.cont, s_cfg.prompt, c->max_positions);
        s_cleanup();
        return 2;
    }
    if (c->layers > S_MAX_LAYERS ||
        (s_cfg.ctx + KVEDGE_E2E_CHUNK_TOKENS_DEFAULT - 1) / KVEDGE_E2E_CHUNK_TOKENS_DEFAULT >
            S_MAX_CHUNKS)
        s_die("model or context too large for this benchmark", KVEDGE_ETOOBIG);
    s_check(kvedge_e2e_model(s_dec, S_MODEL_ID, &s_model), "model");
    char why[512] = "";
    if (kvedge_quality_load(s_cfg.quality, &s_prof, why, sizeof why) != 0)
        s_die(why, 0);
    s_read_docs(ids, c->vocab);
    s_rows_make();
    s_start();
    s_cloud = s_connect(s_node_ep);
    s_prefill(s_ttft_doc.tok);
    for (size_t d = 0; d < s_ndocs; d++)
        s_prefill(s_docs[d].tok);

    printf("## The cache optimizer over a cloud link sweep (bench_optimizer): %ld cores\n\n"
           "Model %s (models/kjv/cloud: %u layers, %u heads x %u, %u positions), fp32 CPU "
           "decoder. Context %u tokens (lossless fp16 on the cloud node; the node derives the "
           "other rungs%s), TTFT prompt %u tokens, 1 new token; quality over %zu held-out "
           "documents x %u scored tokens. Profile %s. Links: %s one way, a fresh proxy per "
           "rate. TTFT: medians of %u runs after a warm-up, rows interleaved.\n\n",
           sysconf(_SC_NPROCESSORS_ONLN), S_MODEL_ID, c->layers, c->heads, c->head_dim,
           c->max_positions, s_cfg.ctx, s_cfg.keep_derived ? " and keeps them" : " per request",
           s_cfg.prompt, s_ndocs, s_cfg.cont, s_cfg.quality, s_cfg.latency, s_cfg.runs);
    fflush(stdout);
    s_run();
    printf("bench_optimizer: %.0f s in all; data files in %s\n", bench_now_s() - t_start,
           s_cfg.out);
    s_cleanup();
    free(s_ttft_doc.tok);
    for (size_t d = 0; d < s_ndocs; d++)
        free(s_docs[d].tok);
    return 0;
}
