/* The quality evaluation (clients/lab/eval.h) with the tiny fixture model on an in-process master,
 * cloud node and edge proxy, two documents: lossless gives the reference's logits exactly,
 * int8 stays within a bound derived from the decoder's int8 tolerance, the per-layer profile
 * has one row per layer, the outputs parse, an unregistered model fails rather than being
 * recomputed, bad arguments are refused, the profile written as a quality profile
 * (proxy/quality.h) loads back with the run's figures; and `kvedge eval` end to end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "access/codec/basis.h"
#include "runtime/kvmsg.h"
#include "runtime/log.h"
#include "runtime/mview.h"
#include "clients/decoder/decoder.h"
#include "clients/e2e/e2e.h"
#include "clients/lab/eval.h"
#include "clients/lib/kvedge.h"
#include "proxy/proxy.h"
#include "proxy/quality.h"
#include "store/master/master.h"
#include "store/node/node.h"
#include "tests/common/basis_fixture.h"

#define S_WEIGHTS  KVEDGE_FIXTURES "/opt_tiny.safetensors"
#define S_MODEL_ID "opt-tiny-eval"
#define S_CTX      64 /* shared context tokens */
#define S_CONT     32 /* scored continuation positions */
#define S_CHUNK    32 /* two chunks per context */
#define S_DOC_LEN  (S_CTX + S_CONT + 1)
#define S_DEADLINE 10000
/* The decoder's int8 tolerance on the fixture (tests/clients/decoder/test_decoder.c and test_e2e.c:
 * max |logit diff| of int8 context K/V measured 4.5e-3, asserted <= 2e-2). */
#define S_TOL_INT8 2e-2

/* ---------------------------------------------------------------- the world */

static struct {
    kvedge_decoder_t *dec;
    const kvedge_decoder_config_t *c;
    kvedge_model_t model;
    int32_t docs[3][S_DOC_LEN]; /* two long enough, one (the middle one) too short */
    const int32_t *doc_p[3];
    size_t doc_len[3];
    char root[64], m_ep[128], m_pub[128], n_ep[128], p_ep[128];
    kvedge_master_t *master;
    kvedge_mview_t *reg;
    kvedge_node_t *node;
    kvedge_proxy_t *proxy;
    kvedge_client_t *cloud, *edge;
} s_w;

static kvedge_client_t *s_client(const char *ep)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = S_DEADLINE;
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    if (rc != KVEDGE_OK)
        fail_msg("connect %s: %s", ep, kvedge_strerror(rc));
    return c;
}

/* Registers the record of scheme `name` (stored as S_MODEL_ID@name) with the master. */
static void s_register(const char *name)
{
    kvedge_eval_scheme_t s;
    kvedge_model_t m;
    assert_int_equal(kvedge_eval_scheme_parse(name, &s), KVEDGE_OK);
    assert_int_equal(kvedge_eval_model(&s_w.model, &s, &m), KVEDGE_OK);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_model_pack(&m, body, &len), KVEDGE_OK);
    char key[200];
    snprintf(key, sizeof key, "model/%s", m.id);
    assert_int_equal(kvedge_mview_set(s_w.reg, key, body, len, 3000), KVEDGE_OK);
}

static int s_setup(void **state)
{
    (void)state;
    kvedge_log_set_level(KVEDGE_LOG_WARN);
    s_w.dec = kvedge_decoder_new();
    assert_non_null(s_w.dec);
    int rc = kvedge_decoder_load(s_w.dec, S_WEIGHTS, 0);
    if (rc != KVEDGE_OK)
        fail_msg("load %s: %s (%s)", S_WEIGHTS, kvedge_strerror(rc), kvedge_decoder_error(s_w.dec));
    s_w.c = kvedge_decoder_config(s_w.dec);
    assert_true(S_DOC_LEN <= s_w.c->max_positions);
    assert_int_equal(kvedge_e2e_model(s_w.dec, S_MODEL_ID, &s_w.model), KVEDGE_OK);
    uint64_t x = 0xe7a1;
    for (int d = 0; d < 3; d++) {
        for (int i = 0; i < S_DOC_LEN; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            s_w.docs[d][i] = (int32_t)(4 + (x >> 33) % (s_w.c->vocab - 4));
        }
        s_w.doc_p[d] = s_w.docs[d];
        s_w.doc_len[d] = d == 1 ? S_DOC_LEN - 1 : S_DOC_LEN;
    }

    snprintf(s_w.root, sizeof s_w.root, "/tmp/kvedge-test-eval-XXXXXX");
    assert_non_null(mkdtemp(s_w.root));
    snprintf(s_w.m_ep, sizeof s_w.m_ep, "ipc://%s/m.sock", s_w.root);
    snprintf(s_w.m_pub, sizeof s_w.m_pub, "ipc://%s/mp.sock", s_w.root);
    snprintf(s_w.n_ep, sizeof s_w.n_ep, "ipc://%s/cloud.sock", s_w.root);
    snprintf(s_w.p_ep, sizeof s_w.p_ep, "ipc://%s/proxy.sock", s_w.root);
    char dir[200], why[256] = "";
    snprintf(dir, sizeof dir, "%s/master", s_w.root);
    kvedge_master_opts_t mo;
    kvedge_master_opts_default(&mo);
    mo.bind = s_w.m_ep;
    mo.pub = s_w.m_pub;
    mo.data_dir = dir;
    mo.insecure = true;
    assert_int_equal(kvedge_master_start(&mo, &s_w.master, NULL, 0), KVEDGE_OK);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = s_w.m_ep;
    vo.pub = s_w.m_pub;
    vo.prefix = "model/";
    assert_int_equal(kvedge_mview_start(&vo, &s_w.reg), KVEDGE_OK);
    const char *names[] = {"lossless", "int8", "int4-g32", "think-50"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        s_register(names[i]);

    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = KVEDGE_ROLE_CLOUD;
    ns.insecure = true;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s/cloud", s_w.root);
    snprintf(ns.bind, sizeof ns.bind, "%s", s_w.n_ep);
    snprintf(ns.name, sizeof ns.name, "cloud");
    if (kvedge_node_start(&ns, &s_w.node, why, sizeof why) != KVEDGE_OK)
        fail_msg("node: %s", why);

    char spec[300];
    snprintf(spec, sizeof spec, "cloud cloud %s", s_w.n_ep);
    kvedge_proxy_source_t src;
    assert_int_equal(kvedge_proxy_source_parse(spec, &src), KVEDGE_OK);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = s_w.p_ep;
    po.insecure = true;
    po.id = "proxy";
    po.sources = &src;
    po.nsources = 1;
    po.master = s_w.m_ep;
    po.master_pub = s_w.m_pub;
    if (kvedge_proxy_start(&po, &s_w.proxy, why, sizeof why) != KVEDGE_OK)
        fail_msg("proxy: %s", why);
    assert_int_equal(kvedge_proxy_wait_sources(s_w.proxy, 1, 5000), KVEDGE_OK);
    s_w.cloud = s_client(s_w.n_ep);
    s_w.edge = s_client(s_w.p_ep);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    kvedge_client_destroy(&s_w.edge);
    kvedge_client_destroy(&s_w.cloud);
    kvedge_proxy_destroy(&s_w.proxy);
    kvedge_node_destroy(&s_w.node);
    kvedge_mview_destroy(&s_w.reg);
    kvedge_master_destroy(&s_w.master);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_w.root);
    assert_int_equal(system(cmd), 0);
    kvedge_decoder_destroy(&s_w.dec);
    return 0;
}

/* Options over the three documents with the given schemes and profiles. */
static void s_opts(kvedge_eval_opts_t *o, const kvedge_eval_scheme_t *schemes, size_t n,
                   const kvedge_eval_scheme_t *profiles, size_t np)
{
    memset(o, 0, sizeof *o);
    o->decoder = s_w.dec;
    o->model = &s_w.model;
    o->cloud = s_w.cloud;
    o->proxy = s_w.edge;
    o->docs = s_w.doc_p;
    o->doc_len = s_w.doc_len;
    o->n_docs = 3;
    o->ctx_tokens = S_CTX;
    o->cont_tokens = S_CONT;
    o->chunk_tokens = S_CHUNK;
    o->schemes = schemes;
    o->n_schemes = n;
    o->profiles = profiles;
    o->n_profiles = np;
    o->deadline_ms = S_DEADLINE;
}

static void s_parse(const char *name, kvedge_eval_scheme_t *out)
{
    assert_int_equal(kvedge_eval_scheme_parse(name, out), KVEDGE_OK);
}

/* A printer's output as a string (caller frees). */
static char *s_capture(void (*print)(FILE *, const kvedge_eval_result_t *),
                       const kvedge_eval_result_t *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    print(f, r);
    fclose(f);
    return buf;
}

static void s_print_json(FILE *f, const kvedge_eval_result_t *r)
{
    kvedge_eval_print(f, r, true);
}

static void s_print_text(FILE *f, const kvedge_eval_result_t *r)
{
    kvedge_eval_print(f, r, false);
}

static size_t s_lines(const char *s, bool data_only)
{
    size_t n = 0;
    for (const char *p = s; *p;) {
        const char *e = strchr(p, '\n');
        if (!data_only || *p != '#')
            n++;
        if (!e)
            break;
        p = e + 1;
    }
    return n;
}

/* ---------------------------------------------------------------- 1. the figures */

/* Lossless is the reference bit for bit; int8 within the bound; the profile has a row per
 * layer; every output parses. */
static void test_lossless_int8_profile(void **state)
{
    (void)state;
    kvedge_eval_scheme_t sc[2], pr[2];
    s_parse("lossless", &sc[0]);
    s_parse("int8", &sc[1]);
    s_parse("int4-g32", &pr[0]);
    s_parse("think-50", &pr[1]);
    kvedge_eval_opts_t o;
    s_opts(&o, sc, 2, pr, 2);
    kvedge_eval_result_t *r = NULL;
    int rc = kvedge_eval_run(&o, &r);
    if (rc != KVEDGE_OK)
        fail_msg("eval: %s", kvedge_strerror(rc));
    assert_non_null(r);
    assert_int_equal(r->n_docs, 2);
    assert_int_equal(r->n_short, 1); /* the middle document lacks one target */
    assert_int_equal(r->doc_index[0], 0);
    assert_int_equal(r->doc_index[1], 2);
    assert_int_equal(r->layers, s_w.c->layers);
    assert_int_equal(r->reference.positions, 2 * S_CONT);
    assert_true(isfinite(r->reference.ppl) && r->reference.ppl > 1);

    /* Lossless fp32 through the store, the proxy and the loader: the reference's logits. */
    const kvedge_eval_row_t *ll = &r->scheme[0], *i8 = &r->scheme[1];
    assert_string_equal(ll->name, "lossless");
    assert_int_equal(ll->positions, 2 * S_CONT);
    assert_true(ll->max_abs_diff == 0);
    assert_true(ll->agreement == 1.0);
    assert_true(ll->kl == 0);
    assert_true(ll->ppl == r->reference.ppl);
    assert_true(ll->ppl_rel == 0);
    assert_true(ll->goal_met);
    assert_true(ll->bytes > 0 && ll->fp16_bytes > 0);

    /* int8: the logits within the decoder's int8 tolerance, and so the perplexity: every
     * log-softmax entry moves by at most 2 * max |logit diff| (the log-sum-exp by at most
     * that diff, the target's logit by as much), hence |ln(ppl8 / ppl)| <= 2 * 2e-2, i.e.
     * within 4.1 %. The goal (0.5 %) is reported, not asserted: the fixture's weights are
     * random. */
    assert_string_equal(i8->name, "int8");
    assert_true(i8->max_abs_diff > 0);
    assert_true(i8->max_abs_diff <= S_TOL_INT8);
    double dln = fabs(log(i8->ppl / ll->ppl));
    assert_true(dln <= 2 * i8->max_abs_diff + 1e-12);
    assert_true(dln <= 2 * S_TOL_INT8);
    assert_true(i8->kl >= 0 && i8->kl < 1e-3);
    assert_true(i8->agreement >= 0.9 && i8->agreement <= 1);
    assert_true(i8->bytes < ll->bytes);
    assert_true(i8->goal_pct == KVEDGE_EVAL_GOAL_INT8_PCT);
    printf("  reference ppl %.4f; lossless: max |logit diff| %g, agreement %.3f; int8: ppl "
           "%+.4f%%, max |logit diff| %.3g (tol %.0e), |ln ratio| %.3g <= 2*diff, KL %.3g, "
           "agreement %.3f\n",
           r->reference.ppl, ll->max_abs_diff, ll->agreement, i8->ppl_rel * 100, i8->max_abs_diff,
           S_TOL_INT8, dln, i8->kl, i8->agreement);

    /* The profile: one row per layer, each storing that layer alone in the scheme. */
    assert_int_equal(r->n_profiles, 2);
    for (size_t p = 0; p < 2; p++)
        for (uint32_t l = 0; l < r->layers; l++) {
            const kvedge_eval_row_t *x = &r->profile[p][l];
            assert_string_equal(x->name, pr[p].name);
            assert_int_equal(x->layer, (int)l);
            assert_int_equal(x->positions, 2 * S_CONT);
            assert_true(x->kl > 0 && x->max_abs_diff > 0);
            assert_true(isfinite(x->ppl_rel));
            printf("  layer %u %-9s ppl %+.4f%% KL %.3g\n", l, x->name, x->ppl_rel * 100, x->kl);
        }

    /* Outputs: JSON parses and has what it says; the data files have a line per row. */
    char *js = s_capture(s_print_json, r);
    cJSON *j = cJSON_Parse(js);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "schemes")), 2);
    cJSON *prof = cJSON_GetObjectItem(j, "profiles");
    assert_int_equal(cJSON_GetArraySize(prof), 2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(prof, 0), "layers")),
                     (int)r->layers);
    cJSON *row0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "schemes"), 0);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(row0, "goal_met")));
    assert_true(cJSON_GetObjectItem(row0, "max_abs_logit_diff")->valuedouble == 0);
    cJSON_Delete(j);
    free(js);
    char *txt = s_capture(s_print_text, r);
    assert_non_null(strstr(txt, "bit-identical: met"));
    free(txt);
    char *dat = s_capture(kvedge_eval_print_schemes_dat, r);
    assert_int_equal(s_lines(dat, true), 2);
    free(dat);
    dat = s_capture(kvedge_eval_print_layers_dat, r);
    assert_int_equal(s_lines(dat, true), r->layers);
    free(dat);

    kvedge_eval_result_destroy(&r);
    kvedge_eval_result_destroy(&r);
    assert_null(r);
}

/* ---------------------------------------------------------------- the quality profile */

/* The profile file of a one-document run (profiles int8 and int4-g32) loads back with the
 * run's rows bit for bit; whole-model rows for the lossy ladder schemes. */
static void test_profile_file(void **state)
{
    (void)state;
    kvedge_eval_scheme_t sc[4], pr[2];
    s_parse("lossless", &sc[0]);
    s_parse("int8", &sc[1]);
    s_parse("int4-g32", &sc[2]);
    s_parse("fp16", &sc[3]); /* not a rung: no whole-model row */
    s_parse("int8", &pr[0]);
    s_parse("int4-g32", &pr[1]);
    s_register("fp16");
    kvedge_eval_opts_t o;
    s_opts(&o, sc, 4, pr, 2);
    o.max_docs = 1;
    kvedge_eval_result_t *r = NULL;
    int rc = kvedge_eval_run(&o, &r);
    if (rc != KVEDGE_OK)
        fail_msg("eval: %s", kvedge_strerror(rc));
    assert_int_equal(r->n_docs, 1);

    char path[200], why[512] = "";
    snprintf(path, sizeof path, "%s/quality.json", s_w.root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(kvedge_eval_profile_write(f, r, S_MODEL_ID), KVEDGE_OK);
    assert_int_equal(fclose(f), 0);
    kvedge_quality_profile_t *q = NULL;
    rc = kvedge_quality_load(path, &q, why, sizeof why);
    if (rc != KVEDGE_OK)
        fail_msg("load: %s", why);
    assert_string_equal(kvedge_quality_model(q), S_MODEL_ID);
    assert_int_equal(kvedge_quality_layers(q), r->layers);
    assert_int_equal(kvedge_quality_context_tokens(q), S_CTX);
    assert_int_equal(kvedge_quality_continuation_tokens(q), S_CONT);
    assert_int_equal(kvedge_quality_documents(q), 1);
    assert_int_equal(kvedge_quality_n_rungs(q), 2);
    const kvedge_prec_t rung[2] = {KVEDGE_PREC_INT8, KVEDGE_PREC_INT4_G32};
    for (size_t p = 0; p < 2; p++) {
        assert_int_equal(kvedge_quality_rung(q, p), rung[p]);
        for (uint32_t l = 0; l < r->layers; l++) {
            const kvedge_eval_row_t *x = &r->profile[p][l];
            kvedge_quality_figures_t fg;
            double ppl = -1, kl = -1;
            assert_int_equal(kvedge_quality_figures(q, l, rung[p], &fg), KVEDGE_OK);
            assert_true(fg.ppl_pct == x->ppl_rel * 100);
            assert_true(fg.kl == x->kl);
            assert_true(fg.agreement == x->agreement);
            assert_int_equal(kvedge_quality_cost(q, l, rung[p], KVEDGE_QUALITY_PPL_PCT, &ppl),
                             KVEDGE_OK);
            assert_int_equal(kvedge_quality_cost(q, l, rung[p], KVEDGE_QUALITY_KL, &kl), KVEDGE_OK);
            assert_true(ppl == (x->ppl_rel > 0 ? x->ppl_rel * 100 : 0));
            assert_true(kl == x->kl);
            printf("  layer %u %-8s ppl %+.5f%% (cost %.5f) KL %.3g agree %.4f\n", l,
                   kvedge_prec_name(rung[p]), fg.ppl_pct, ppl, kl, fg.agreement);
        }
    }
    double c;
    assert_int_equal(kvedge_quality_cost(q, 0, KVEDGE_PREC_INT4_G64, KVEDGE_QUALITY_KL, &c),
                     KVEDGE_ENOTFOUND);
    /* Whole-model rows: int8 and int4-g32 (not lossless, not fp16). */
    for (size_t i = 1; i < 3; i++) {
        kvedge_quality_figures_t fg;
        assert_int_equal(kvedge_quality_whole(q, rung[i - 1], &fg), KVEDGE_OK);
        assert_string_equal(r->scheme[i].name, kvedge_prec_name(rung[i - 1]));
        assert_true(fg.ppl_pct == r->scheme[i].ppl_rel * 100);
        assert_true(fg.kl == r->scheme[i].kl);
        assert_true(fg.agreement == r->scheme[i].agreement);
    }
    kvedge_quality_destroy(&q);

    /* Refusals, before anything is written. */
    char *buf = NULL;
    size_t len = 0;
    f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(kvedge_eval_profile_write(f, r, ""), KVEDGE_EINVAL);
    assert_int_equal(kvedge_eval_profile_write(f, NULL, S_MODEL_ID), KVEDGE_EINVAL);
    assert_int_equal(kvedge_eval_profile_write(NULL, r, S_MODEL_ID), KVEDGE_EINVAL);
    char long_id[KVEDGE_MODEL_ID_MAX_BYTES + 2];
    memset(long_id, 'x', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    assert_int_equal(kvedge_eval_profile_write(f, r, long_id), KVEDGE_EINVAL);
    double saved = r->profile[1][0].kl;
    r->profile[1][0].kl = NAN;
    assert_int_equal(kvedge_eval_profile_write(f, r, S_MODEL_ID), KVEDGE_EINVAL);
    r->profile[1][0].kl = saved;
    char name[KVEDGE_EVAL_NAME_BYTES];
    memcpy(name, r->profile[1][0].name, sizeof name);
    snprintf(r->profile[1][0].name, sizeof name, "int4-g16"); /* not a rung */
    assert_int_equal(kvedge_eval_profile_write(f, r, S_MODEL_ID), KVEDGE_EINVAL);
    snprintf(r->profile[1][0].name, sizeof name, "int8"); /* the same rung twice */
    assert_int_equal(kvedge_eval_profile_write(f, r, S_MODEL_ID), KVEDGE_EINVAL);
    memcpy(r->profile[1][0].name, name, sizeof name);
    size_t np = r->n_profiles;
    r->n_profiles = 0;
    assert_int_equal(kvedge_eval_profile_write(f, r, S_MODEL_ID), KVEDGE_EINVAL);
    r->n_profiles = np;
    fflush(f);
    assert_int_equal(len, 0);
    /* A model id that needs escaping round-trips. */
    assert_int_equal(kvedge_eval_profile_write(f, r, "a\"b\\c\n"), KVEDGE_OK);
    fclose(f);
    assert_int_equal(kvedge_quality_parse(buf, len, &q, why, sizeof why), KVEDGE_OK);
    assert_string_equal(kvedge_quality_model(q), "a\"b\\c\n");
    kvedge_quality_destroy(&q);
    free(buf);
    kvedge_eval_result_destroy(&r);
}

/* Scheme to rung, and the ladder's profile list. */
static void test_scheme_prec(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        kvedge_prec_t prec;
    } good[] = {
        {"lossless", KVEDGE_PREC_LOSSLESS},
        {"int8", KVEDGE_PREC_INT8},
        {"int4", KVEDGE_PREC_INT4_G32},
        {"int4-g64", KVEDGE_PREC_INT4_G64},
        {"int4-g128", KVEDGE_PREC_INT4_G128},
        {"think-75", KVEDGE_PREC_MAKE(KVEDGE_PREC_LOSSLESS, KVEDGE_PREC_THINK_75)},
        {"int4-g32+think-50", KVEDGE_PREC_MAKE(KVEDGE_PREC_INT4_G32, KVEDGE_PREC_THINK_50)},
        {"int8+think-75", KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, KVEDGE_PREC_THINK_75)},
        {"tc", KVEDGE_PREC_TC},
        {"int8+ec", KVEDGE_PREC_INT8 | KVEDGE_PREC_EC},
        {"int4-g64+ec", KVEDGE_PREC_INT4_G64 | KVEDGE_PREC_EC},
    };
    kvedge_eval_scheme_t s;
    kvedge_prec_t p;
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        s_parse(good[i].name, &s);
        assert_int_equal(kvedge_eval_scheme_prec(&s, &p), KVEDGE_OK);
        assert_int_equal(p, good[i].prec);
    }
    const char *bad[] = {"fp16",          "int4-g16",      "int4-g256",  "think-60",
                         "int8+think-25", "fp16+think-50", "int4-g16+ec"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        s_parse(bad[i], &s);
        if (kvedge_eval_scheme_prec(&s, &p) != KVEDGE_EINVAL)
            fail_msg("%s taken for a rung", bad[i]);
    }
    assert_int_equal(kvedge_eval_scheme_prec(NULL, &p), KVEDGE_EINVAL);
    assert_int_equal(kvedge_eval_scheme_prec(&s, NULL), KVEDGE_EINVAL);

    kvedge_eval_scheme_t list[KVEDGE_EVAL_MAX_PROFILES];
    size_t n = kvedge_eval_profiles_ladder(list, KVEDGE_EVAL_MAX_PROFILES);
    assert_int_equal(n, 14);
    bool seen[256] = {false};
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(kvedge_eval_scheme_prec(&list[i], &p), KVEDGE_OK);
        assert_true(p != KVEDGE_PREC_LOSSLESS && !seen[p]);
        seen[p] = true;
    }
    assert_int_equal(kvedge_eval_profiles_ladder(list, 3), 3);
}

/* ---------------------------------------------------------------- tc and +ec, coded here */

/* Registers a fixture basis (exact signed permutations, one step) of the fixture model's shape
 * under model id `id`, layers + extra_layers deep. */
static void s_basis(const char *id, float step, uint32_t extra_layers)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kt_basis_file(id, s_w.c->layers + extra_layers, s_w.model.kv_heads,
                                   s_w.c->head_dim, step, 11, &buf, &len),
                     0);
    kvedge_basis_t *b = NULL;
    assert_int_equal(kvedge_basis_parse(buf, len, &b, NULL, 0), KVEDGE_OK);
    assert_int_equal(kvedge_basis_register(&b), KVEDGE_OK);
    free(buf);
}

/* One scheme (and int8 through the node beside it when with_int8) on model id `id`. */
static int s_run_on(const char *id, const char *scheme, bool with_int8, kvedge_eval_result_t **r)
{
    kvedge_eval_scheme_t sc[2];
    s_parse(scheme, &sc[0]);
    s_parse("int8", &sc[1]);
    kvedge_model_t m = s_w.model;
    snprintf(m.id, sizeof m.id, "%s", id);
    kvedge_eval_opts_t o;
    s_opts(&o, sc, with_int8 ? 2 : 1, NULL, 0);
    o.model = &m;
    return kvedge_eval_run(&o, r);
}

/* int4-g32+ec gives int4-g32's values exactly (its KL, its logits) from its own blocks; tc
 * decodes its blocks with the registered basis: a finer step gives a lower KL for more bytes,
 * every (layer, head, chunk) block counted; a tc scheme without a registered basis of the model
 * is ENOBASIS, with a basis of another shape ESHAPE; tc and +ec also work as profile schemes,
 * and the quality profile written holds tc (per layer and whole-model) but no +ec rung. */
static void test_tc_ec(void **state)
{
    (void)state;
    kvedge_eval_scheme_t sc[5], pr[2];
    s_parse("int8", &sc[0]);
    s_parse("int4-g32", &sc[1]);
    s_parse("int4-g32+ec", &sc[2]);
    s_parse("int8+ec", &sc[3]);
    s_parse("tc", &sc[4]);
    s_parse("tc", &pr[0]);
    s_parse("int8+ec", &pr[1]);
    s_basis(S_MODEL_ID, 1.0f / 1024, 0);
    kvedge_eval_opts_t o;
    s_opts(&o, sc, 5, pr, 2);
    kvedge_eval_result_t *r = NULL;
    int rc = kvedge_eval_run(&o, &r);
    if (rc != KVEDGE_OK)
        fail_msg("eval: %s", kvedge_strerror(rc));
    const kvedge_eval_row_t *i8 = &r->scheme[0], *i4 = &r->scheme[1], *i4e = &r->scheme[2],
                            *i8e = &r->scheme[3], *tc = &r->scheme[4];
    for (int i = 0; i < 5; i++)
        printf("  %-12s KL %.4g max|dlogit| %.4g agreement %.3f bytes %llu (/fp16 %.3f)\n",
               r->scheme[i].name, r->scheme[i].kl, r->scheme[i].max_abs_diff,
               r->scheme[i].agreement, (unsigned long long)r->scheme[i].bytes,
               (double)r->scheme[i].bytes / (double)r->scheme[i].fp16_bytes);
    assert_string_equal(i4e->name, "int4-g32+ec");
    assert_true(i4e->kl == i4->kl && i4e->max_abs_diff == i4->max_abs_diff);
    assert_true(i8e->kl == i8->kl && i8e->max_abs_diff == i8->max_abs_diff);
    assert_true(i4e->bytes > 0 && i4e->fp16_bytes == i4->fp16_bytes);
    assert_true(i4e->goal_pct == KVEDGE_EVAL_GOAL_INT4_G32_PCT);
    assert_string_equal(tc->name, "tc");
    assert_true(tc->kl > 0 && tc->kl < i4->kl);
    assert_true(tc->bytes > 0 && tc->fp16_bytes == i8->fp16_bytes);
    assert_true(tc->goal_pct < 0);
    for (uint32_t l = 0; l < r->layers; l++) {
        assert_true(r->profile[0][l].kl > 0 && r->profile[0][l].kl < tc->kl * 1.5);
        assert_true(isfinite(r->profile[1][l].kl));
    }

    /* The quality profile: an +ec profile scheme is refused; with int8 in its place the file
     * loads, tc per layer and whole-model, no whole-model row for the +ec schemes. */
    char path[200], why[512] = "";
    snprintf(path, sizeof path, "%s/quality-tc.json", s_w.root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(kvedge_eval_profile_write(f, r, S_MODEL_ID), KVEDGE_EINVAL);
    for (uint32_t l = 0; l < r->layers; l++)
        snprintf(r->profile[1][l].name, sizeof r->profile[1][l].name, "int8");
    assert_int_equal(kvedge_eval_profile_write(f, r, S_MODEL_ID), KVEDGE_OK);
    assert_int_equal(fclose(f), 0);
    kvedge_quality_profile_t *q = NULL;
    if (kvedge_quality_load(path, &q, why, sizeof why) != KVEDGE_OK)
        fail_msg("load: %s", why);
    assert_int_equal(kvedge_quality_n_rungs(q), 2);
    assert_int_equal(kvedge_quality_rung(q, 0), KVEDGE_PREC_TC);
    kvedge_quality_figures_t fg;
    assert_int_equal(kvedge_quality_figures(q, 0, KVEDGE_PREC_TC, &fg), KVEDGE_OK);
    assert_true(fg.kl == r->profile[0][0].kl);
    assert_int_equal(kvedge_quality_whole(q, KVEDGE_PREC_TC, &fg), KVEDGE_OK);
    assert_true(fg.kl == tc->kl);
    kvedge_quality_destroy(&q);
    f = fopen(path, "r");
    assert_non_null(f);
    char text[16384];
    text[fread(text, 1, sizeof text - 1, f)] = '\0';
    fclose(f);
    assert_null(strstr(text, "+ec"));
    const double fine_kl = tc->kl;
    const uint64_t fine_bytes = tc->bytes;
    kvedge_eval_result_destroy(&r);

    /* A coarse basis (step 1/8) of another model id of the same shape. */
    s_basis(S_MODEL_ID "-coarse", 0.125f, 0);
    assert_int_equal(s_run_on(S_MODEL_ID "-coarse", "tc", false, &r), KVEDGE_OK);
    printf("  tc step 1/1024: KL %.4g, %llu bytes; step 1/8: KL %.4g, %llu bytes\n", fine_kl,
           (unsigned long long)fine_bytes, r->scheme[0].kl, (unsigned long long)r->scheme[0].bytes);
    assert_true(r->scheme[0].kl > fine_kl);
    assert_true(r->scheme[0].bytes < fine_bytes);
    kvedge_eval_result_destroy(&r);

    assert_int_equal(s_run_on(S_MODEL_ID "-nobasis", "tc", false, &r), KVEDGE_ENOBASIS);
    assert_null(r);
    s_basis(S_MODEL_ID "-shape", 0.125f, 1);
    assert_int_equal(s_run_on(S_MODEL_ID "-shape", "tc", false, &r), KVEDGE_ESHAPE);
    assert_null(r);
}

/* ---------------------------------------------------------------- 2. refusals */

/* A scheme whose model id the proxy never learns fails with ENOMODEL after the retry window:
 * it is never silently computed by the decoder. */
static void test_unknown_model_fails(void **state)
{
    (void)state;
    kvedge_eval_scheme_t sc;
    s_parse("int4-g64", &sc); /* not registered */
    kvedge_eval_opts_t o;
    s_opts(&o, &sc, 1, NULL, 0);
    o.wait_ms = 300;
    kvedge_eval_result_t *r = NULL;
    assert_int_equal(kvedge_eval_run(&o, &r), KVEDGE_ENOMODEL);
    assert_null(r);
}

static void test_scheme_names(void **state)
{
    (void)state;
    kvedge_eval_scheme_t s;
    s_parse("int4", &s);
    assert_string_equal(s.name, "int4-g32");
    assert_int_equal(s.group_size, 32);
    assert_true(s.goal_pct == KVEDGE_EVAL_GOAL_INT4_G32_PCT);
    s_parse("int4-g128+think-75", &s);
    assert_string_equal(s.name, "int4-g128+think-75");
    assert_int_equal(s.keep_pct, 75);
    assert_true(s.goal_pct < 0);
    s_parse("lossless+think-50", &s);
    assert_string_equal(s.name, "think-50");
    assert_int_equal(s.scheme, KVEDGE_SCHEME_LOSSLESS);
    s_parse("fp16", &s);
    assert_int_equal(s.dtype, KVEDGE_DTYPE_FP16);
    assert_true(s.goal_pct < 0);
    s_parse("tc", &s);
    assert_string_equal(s.name, "tc");
    assert_int_equal(s.scheme, KVEDGE_SCHEME_TC);
    assert_true(s.goal_pct < 0 && !s.ec && s.keep_pct == 100);
    s_parse("int4+ec", &s);
    assert_string_equal(s.name, "int4-g32+ec");
    assert_true(s.ec && s.goal_pct == KVEDGE_EVAL_GOAL_INT4_G32_PCT);
    s_parse("int8+ec", &s);
    assert_string_equal(s.name, "int8+ec");
    assert_true(s.ec && s.scheme == KVEDGE_SCHEME_INT8);
    s_parse("lossless", &s);
    assert_true(s.goal_pct == 0);
    const char *bad[] = {"",
                         "int3",
                         "int4-g3",
                         "int4-g",
                         "int8x",
                         "think-0",
                         "think-100",
                         "think-",
                         "int8+",
                         "int8+think-50x",
                         "Int8",
                         "int4-g1x",
                         "lossless+",
                         "+think-5",
                         "tc+think-50",
                         "tc+ec",
                         "tcx",
                         "lossless+ec",
                         "fp16+ec",
                         "think-50+ec",
                         "int4-g32+think-50+ec",
                         "int8+ec+ec",
                         "int8+ecx"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (kvedge_eval_scheme_parse(bad[i], &s) != KVEDGE_EINVAL)
            fail_msg("'%s' was accepted", bad[i]);
    assert_int_equal(kvedge_eval_scheme_parse(NULL, &s), KVEDGE_EINVAL);
    assert_int_equal(kvedge_eval_scheme_parse("int8", NULL), KVEDGE_EINVAL);

    kvedge_eval_scheme_t list[KVEDGE_EVAL_MAX_SCHEMES];
    assert_int_equal(kvedge_eval_schemes_default(list, KVEDGE_EVAL_MAX_SCHEMES), 9);
    assert_string_equal(list[0].name, "lossless");
    assert_string_equal(list[8].name, "int4-g32+think-50");
    assert_int_equal(kvedge_eval_schemes_default(list, 2), 2);
    assert_int_equal(kvedge_eval_profiles_default(list, KVEDGE_EVAL_MAX_PROFILES), 2);
    assert_int_equal(kvedge_eval_keep_channels(50, 16), 8);
    assert_int_equal(kvedge_eval_keep_channels(75, 32), 24);
    assert_int_equal(kvedge_eval_keep_channels(1, 16), 1);
    assert_int_equal(kvedge_eval_keep_channels(100, 16), 16);

    kvedge_model_t m = s_w.model, out;
    memset(m.id, 'x', KVEDGE_MODEL_ID_MAX_BYTES - 4);
    m.id[KVEDGE_MODEL_ID_MAX_BYTES - 4] = '\0';
    assert_int_equal(kvedge_eval_model(&m, &s, &out), KVEDGE_ETOOBIG);
    assert_int_equal(kvedge_eval_model(&s_w.model, &s, &out), KVEDGE_OK);
    assert_string_equal(out.id, S_MODEL_ID "@lossless");
    assert_int_equal(kvedge_eval_model(NULL, &s, &out), KVEDGE_EINVAL);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    kvedge_eval_scheme_t sc[2], pr;
    s_parse("lossless", &sc[0]);
    s_parse("int8", &sc[1]);
    s_parse("int4-g32", &pr);
    kvedge_eval_opts_t o;
    kvedge_eval_result_t *r = NULL;
    assert_int_equal(kvedge_eval_run(NULL, &r), KVEDGE_EINVAL);
    s_opts(&o, sc, 2, &pr, 1);
    assert_int_equal(kvedge_eval_run(&o, NULL), KVEDGE_EINVAL);

    static const char *const what[] = {"no decoder",
                                       "no cloud",
                                       "no proxy",
                                       "no documents",
                                       "context 0",
                                       "continuation 0",
                                       "no scheme",
                                       "too many schemes",
                                       "too many profiles",
                                       "negative deadline",
                                       "NaN budget",
                                       "over the positions",
                                       "no document long enough"};
    for (size_t i = 0; i < sizeof what / sizeof *what; i++) {
        s_opts(&o, sc, 2, &pr, 1);
        int want = KVEDGE_EINVAL;
        switch (i) {
        case 0:
            o.decoder = NULL;
            break;
        case 1:
            o.cloud = NULL;
            break;
        case 2:
            o.proxy = NULL;
            break;
        case 3:
            o.n_docs = 0;
            break;
        case 4:
            o.ctx_tokens = 0;
            break;
        case 5:
            o.cont_tokens = 0;
            break;
        case 6:
            o.n_schemes = 0;
            break;
        case 7:
            o.n_schemes = KVEDGE_EVAL_MAX_SCHEMES + 1;
            break;
        case 8:
            o.n_profiles = KVEDGE_EVAL_MAX_PROFILES + 1;
            break;
        case 9:
            o.deadline_ms = -1;
            break;
        case 10:
            o.max_s = NAN;
            break;
        case 11:
            o.cont_tokens = 200;
            want = KVEDGE_ETOOBIG;
            break;
        default:
            o.cont_tokens = S_CONT + 8;
            break; /* fits the positions, no document does */
        }
        int rc = kvedge_eval_run(&o, &r);
        if (rc != want)
            fail_msg("%s: %s, expected %s", what[i], kvedge_errname(rc), kvedge_errname(want));
        assert_null(r);
    }

    /* Scheme lists: a duplicate name, a name not in canonical form, a model of another shape. */
    kvedge_eval_scheme_t dup[2] = {sc[1], sc[1]};
    s_opts(&o, dup, 2, NULL, 0);
    assert_int_equal(kvedge_eval_run(&o, &r), KVEDGE_EINVAL);
    kvedge_eval_scheme_t odd = sc[1];
    snprintf(odd.name, sizeof odd.name, "int4");
    s_opts(&o, &odd, 1, NULL, 0);
    assert_int_equal(kvedge_eval_run(&o, &r), KVEDGE_EINVAL);
    odd = sc[1];
    odd.scheme = KVEDGE_SCHEME_INT4; /* the name says int8 */
    s_opts(&o, &odd, 1, NULL, 0);
    assert_int_equal(kvedge_eval_run(&o, &r), KVEDGE_EINVAL);
    kvedge_model_t other = s_w.model;
    other.layers++;
    s_opts(&o, sc, 2, NULL, 0);
    o.model = &other;
    assert_int_equal(kvedge_eval_run(&o, &r), KVEDGE_EINVAL);
    /* A token outside the vocabulary in a measured document. */
    int32_t bad_doc[S_DOC_LEN];
    memcpy(bad_doc, s_w.docs[0], sizeof bad_doc);
    bad_doc[5] = (int32_t)s_w.c->vocab;
    const int32_t *bd[1] = {bad_doc};
    size_t bl[1] = {S_DOC_LEN};
    s_opts(&o, sc, 1, NULL, 0);
    o.docs = bd;
    o.doc_len = bl;
    o.n_docs = 1;
    assert_int_equal(kvedge_eval_run(&o, &r), KVEDGE_EINVAL);
    assert_null(r);
    kvedge_eval_result_destroy(NULL);
    kvedge_eval_print(NULL, NULL, false);
}

/* ---------------------------------------------------------------- 3. the command */

/* Runs `kvedge ARGS`, stdout (stderr when err) to *out (caller frees); returns the exit code. */
static int s_kvedge_v(bool err, char **out, const char *fmt, va_list ap)
{
    char args[2048], cmd[4096];
    vsnprintf(args, sizeof args, fmt, ap);
    snprintf(cmd, sizeof cmd, "%s %s %s", KVEDGE_BIN, args,
             err ? "2>&1 >/dev/null" : "2>/dev/null");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    assert_non_null(m);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0)
        fwrite(chunk, 1, n, m);
    fclose(m);
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int s_kvedge(char **out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ex = s_kvedge_v(false, out, fmt, ap);
    va_end(ap);
    return ex;
}

/* s_kvedge with stderr to *out. */
static int s_kvedge_err(char **out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int ex = s_kvedge_v(true, out, fmt, ap);
    va_end(ap);
    return ex;
}

static void test_cli(void **state)
{
    (void)state;
    char ids[200], plots[200];
    snprintf(ids, sizeof ids, "%s/docs.ids", s_w.root);
    snprintf(plots, sizeof plots, "%s/plots", s_w.root);
    assert_int_equal(mkdir(plots, 0700), 0);
    FILE *f = fopen(ids, "w");
    assert_non_null(f);
    for (int d = 0; d < 3; d += 2) { /* the two long documents, a blank line between */
        for (int i = 0; i < S_DOC_LEN; i++)
            fprintf(f, "%d%s", s_w.docs[d][i], (i + 1) % 20 && i + 1 < S_DOC_LEN ? " " : "\n");
        fprintf(f, d == 0 ? "  \n" : "");
    }
    fclose(f);
    const char *common = "--weights " S_WEIGHTS " --context 64 --continuation 32 --chunk-tokens 32";
    char *out = NULL;
    int ex = s_kvedge(&out,
                      "eval %s --ids %s --schemes lossless,int8 --profiles int4 -q --json "
                      "--plot-dir %s",
                      common, ids, plots);
    assert_int_equal(ex, 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetObjectItem(j, "documents")->valueint, 2);
    cJSON *ll = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "schemes"), 0);
    assert_true(cJSON_GetObjectItem(ll, "max_abs_logit_diff")->valuedouble == 0);
    assert_true(cJSON_GetObjectItem(ll, "agreement")->valuedouble == 1);
    cJSON_Delete(j);
    free(out);
    char path[300];
    const char *files[] = {"quality_schemes.dat", "quality_layers.dat", "quality.json"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", plots, files[i]);
        assert_int_equal(access(path, R_OK), 0);
    }
    ex = s_kvedge(&out, "eval %s --ids %s --schemes int8 --no-profile -q", common, ids);
    assert_int_equal(ex, 0);
    assert_non_null(strstr(out, "int8"));
    free(out);

    /* --profile-out: the quality profile, loaded back; --profiles ladder measures 14 rungs. */
    char qpath[300], why[512] = "";
    snprintf(qpath, sizeof qpath, "%s/quality.json", plots);
    ex = s_kvedge(NULL,
                  "eval %s --ids %s --schemes lossless,int8 --profiles int8,int4 --docs 1 -q "
                  "--model-id cli-model --profile-out %s",
                  common, ids, qpath);
    assert_int_equal(ex, 0);
    kvedge_quality_profile_t *q = NULL;
    if (kvedge_quality_load(qpath, &q, why, sizeof why) != KVEDGE_OK)
        fail_msg("%s", why);
    assert_string_equal(kvedge_quality_model(q), "cli-model");
    assert_int_equal(kvedge_quality_layers(q), s_w.c->layers);
    assert_int_equal(kvedge_quality_documents(q), 1);
    assert_int_equal(kvedge_quality_n_rungs(q), 2);
    assert_int_equal(kvedge_quality_rung(q, 1), KVEDGE_PREC_INT4_G32);
    kvedge_quality_figures_t fg;
    assert_int_equal(kvedge_quality_whole(q, KVEDGE_PREC_INT8, &fg), KVEDGE_OK);
    kvedge_quality_destroy(&q);
    char tmp[sizeof qpath + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", qpath);
    assert_int_equal(access(tmp, F_OK), -1); /* renamed into place */
    ex = s_kvedge(NULL,
                  "eval %s --ids %s --schemes lossless --profiles ladder --docs 1 -q "
                  "--profile-out %s",
                  common, ids, qpath);
    assert_int_equal(ex, 0);
    if (kvedge_quality_load(qpath, &q, why, sizeof why) != KVEDGE_OK)
        fail_msg("%s", why);
    assert_int_equal(kvedge_quality_n_rungs(q), 14);
    assert_string_equal(kvedge_quality_model(q), "kvedge-eval");
    kvedge_quality_destroy(&q);

    /* tc with --basis (and int4-g32+ec beside it); without one and none in the model's
     * folder, or one of another model: exit 2. */
    char basis[300], other[300];
    snprintf(basis, sizeof basis, "%s/model.kvb", s_w.root);
    snprintf(other, sizeof other, "%s/other.kvb", s_w.root);
    assert_int_equal(kt_basis_write(basis, "kvedge-eval", s_w.c->layers, s_w.model.kv_heads,
                                    s_w.c->head_dim, 1.0f / 64, 5),
                     0);
    assert_int_equal(kt_basis_write(other, "another-model", s_w.c->layers, s_w.model.kv_heads,
                                    s_w.c->head_dim, 1.0f / 64, 5),
                     0);
    ex = s_kvedge(&out,
                  "eval %s --ids %s --schemes int4-g32+ec,tc --no-profile --docs 1 -q --json "
                  "--basis %s",
                  common, ids, basis);
    assert_int_equal(ex, 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    cJSON *tcrow = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "schemes"), 1);
    assert_string_equal(cJSON_GetObjectItem(tcrow, "name")->valuestring, "tc");
    assert_true(cJSON_GetObjectItem(tcrow, "bytes")->valuedouble > 0);
    assert_true(cJSON_GetObjectItem(tcrow, "kl")->valuedouble > 0);
    cJSON_Delete(j);
    free(out);
    ex = s_kvedge_err(&out, "eval %s --ids %s --schemes tc --no-profile -q", common, ids);
    assert_int_equal(ex, 2);
    assert_non_null(strstr(out, "needs the model's coding basis"));
    free(out);
    ex = s_kvedge_err(&out, "eval %s --ids %s --schemes tc --no-profile -q --basis %s", common, ids,
                      other);
    assert_int_equal(ex, 2);
    assert_non_null(strstr(out, "is for model another-model, not kvedge-eval"));
    free(out);

    /* Usage errors: exit 2, before anything starts. */
    const char *bad[] = {
        "eval --ids /dev/null",                          /* no weights */
        "eval --weights " S_WEIGHTS,                     /* no documents */
        "eval --weights " S_WEIGHTS " --ids X --text Y", /* both */
        "eval --weights " S_WEIGHTS " --ids X --context 0",
        "eval --weights " S_WEIGHTS " --ids X --schemes int3",
        "eval --weights " S_WEIGHTS " --ids X --schemes int8,int8",
        "eval --weights " S_WEIGHTS " --ids X --bogus",
        "eval --weights " S_WEIGHTS " --ids X extra",
        "eval --weights " S_WEIGHTS " --ids X --proxy ipc:///nowhere", /* without -H */
        "-H ipc:///nowhere eval --weights " S_WEIGHTS " --ids X",      /* without --proxy */
        "eval --weights " S_WEIGHTS " --ids X --plot-dir /nonexistent/dir",
        "eval --weights " S_WEIGHTS " --ids X --profiles fp16 --profile-out /tmp/q.json",
        "eval --weights " S_WEIGHTS " --ids X --profiles int8,int4-g16 --profile-out /tmp/q.json",
        "eval --weights " S_WEIGHTS " --ids X --no-profile --profile-out /tmp/q.json",
        "eval --weights " S_WEIGHTS " --ids X --profile-out /nonexistent/dir/q.json",
        "eval --weights " S_WEIGHTS " --ids X --profile-out ''",
        "eval --weights " S_WEIGHTS " --ids X --profiles ladder,int8",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if ((ex = s_kvedge(NULL, "%s", bad[i])) != 2)
            fail_msg("`kvedge %s` exited %d, expected 2", bad[i], ex);
    /* Refused once the weights are loaded: positions, ids outside the vocabulary, too short. */
    ex = s_kvedge(NULL, "eval %s --ids %s --context 150 --continuation 20", common, ids);
    assert_int_equal(ex, 2);
    ex = s_kvedge(NULL, "eval %s --ids %s --context 100 --continuation 20", common, ids);
    assert_int_equal(ex, 2);
    snprintf(path, sizeof path, "%s/bad.ids", s_w.root);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "1 2 3\n4 5 %u\n", s_w.c->vocab);
    fclose(f);
    ex = s_kvedge(NULL, "eval %s --ids %s", common, path);
    assert_int_equal(ex, 2);
    /* Text through the tokenizer: the KJV tokenizer's ids run past the fixture's 256 (refused
     * with the id named), and a folder without a tokenizer. */
    snprintf(path, sizeof path, "%s/chapters.txt", s_w.root);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "Genesis 1\nIn the beginning God created the heaven and the earth.\n\n"
               "Genesis 2\nThus the heavens and the earth were finished.\n\n");
    fclose(f);
    ex = s_kvedge(NULL, "eval %s --tokenizer %s --text %s", common,
                  KVEDGE_FIXTURES "/tokenizer/kjv", path);
    assert_int_equal(ex, 2);
    ex = s_kvedge(NULL, "eval %s --tokenizer %s --text %s", common, s_w.root, path);
    assert_int_equal(ex, 1);
    assert_int_equal(s_kvedge(NULL, "eval --help"), 0);
}

/* A Llama-family model (the trained edge model of models/kjv/llama: rotary positions, 4 query
 * heads on 1 KV head): `kvedge eval` on its folder takes the folder's tokenizer.json (BOS
 * first), stores each scheme under "kjv-edge@SCHEME@rope-XXXXXXXX" and fetches the KV heads
 * through the proxy; lossless is the reference bit for bit, int8 and ThinK (rotate-half pairs
 * kept) close to it. */
static void test_cli_llama(void **state)
{
    (void)state;
    const char *dir = KVEDGE_MODELS "/kjv/llama/edge";
    char *out = NULL;
    int ex = s_kvedge(&out,
                      "eval --weights %s --file %s/kjv/heldout.txt --docs 2 --context 64 "
                      "--continuation 32 --chunk-tokens 32 --schemes lossless,int8,think-50 "
                      "--no-profile -q --json --model-id kjv-edge",
                      dir, KVEDGE_MODELS);
    assert_int_equal(ex, 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetObjectItem(j, "documents")->valueint, 2);
    cJSON *sc = cJSON_GetObjectItem(j, "schemes");
    assert_int_equal(cJSON_GetArraySize(sc), 3);
    cJSON *ll = cJSON_GetArrayItem(sc, 0), *i8 = cJSON_GetArrayItem(sc, 1),
          *th = cJSON_GetArrayItem(sc, 2);
    assert_true(cJSON_GetObjectItem(ll, "max_abs_logit_diff")->valuedouble == 0);
    assert_true(cJSON_GetObjectItem(ll, "agreement")->valuedouble == 1);
    double d8 = cJSON_GetObjectItem(i8, "max_abs_logit_diff")->valuedouble,
           dth = cJSON_GetObjectItem(th, "max_abs_logit_diff")->valuedouble;
    assert_true(d8 > 0 && d8 < 0.1);
    assert_true(dth > 0 && isfinite(dth));
    assert_true(cJSON_GetObjectItem(i8, "agreement")->valuedouble >= 0.9);
    printf("  kjv llama edge: int8 max |logit diff| %.3g, think-50 %.3g\n", d8, dth);
    cJSON_Delete(j);
    free(out);
    /* tc with the folder's committed basis (models/kjv/llama/edge/basis.kvb, of
     * kjv-llama-edge@rope-...): on two documents within 4x int4-g32's KL (2.3x here; 1.05x on
     * the 24 of docs/benchmarks.md) in fewer bytes than int4-g32+ec. */
    ex = s_kvedge(&out,
                  "eval --weights %s --file %s/kjv/heldout.txt --docs 2 --context 256 "
                  "--continuation 32 --schemes int4-g32+ec,tc --no-profile -q --json "
                  "--model-id kjv-llama-edge",
                  dir, KVEDGE_MODELS);
    assert_int_equal(ex, 0);
    j = cJSON_Parse(out);
    assert_non_null(j);
    sc = cJSON_GetObjectItem(j, "schemes");
    cJSON *ec = cJSON_GetArrayItem(sc, 0), *tc = cJSON_GetArrayItem(sc, 1);
    double kl_ec = cJSON_GetObjectItem(ec, "kl")->valuedouble,
           kl_tc = cJSON_GetObjectItem(tc, "kl")->valuedouble,
           b_ec = cJSON_GetObjectItem(ec, "bytes")->valuedouble,
           b_tc = cJSON_GetObjectItem(tc, "bytes")->valuedouble;
    printf("  kjv llama edge: int4-g32+ec KL %.3g, %.0f bytes; tc KL %.3g, %.0f bytes\n", kl_ec,
           b_ec, kl_tc, b_tc);
    assert_true(kl_tc > 0 && kl_tc < 4 * kl_ec);
    assert_true(b_tc > 0 && b_tc < 0.8 * b_ec);
    cJSON_Delete(j);
    free(out);
    /* Without a tokenizer: a folder with none is refused before anything runs. */
    ex = s_kvedge(&out, "eval --weights %s --file %s/kjv/heldout.txt -q",
                  KVEDGE_FIXTURES "/opt_tiny.safetensors", KVEDGE_MODELS);
    assert_int_equal(ex, 2);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lossless_int8_profile),
        cmocka_unit_test(test_profile_file),
        cmocka_unit_test(test_scheme_prec),
        cmocka_unit_test(test_tc_ec),
        cmocka_unit_test(test_unknown_model_fails),
        cmocka_unit_test(test_scheme_names),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_cli_llama),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
