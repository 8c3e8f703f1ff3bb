/* Large-small quality (clients/lab/lseval.h) on two small synthesized models: the block round
 * trip, the rows against independent computations (cloud-only is its own reference; edge-only
 * and no-context against plain prefills), a CE-LSLM row through a near-identity adapter (the
 * edge model is the cloud model), adapters for other models and too-short text refused, and
 * `kvedge lseval` end to end. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "clients/e2e/adapter.h"
#include "clients/decoder/decoder.h"
#include "clients/e2e/layermap.h"
#include "clients/lab/lseval.h"
#include "access/codec/error.h"
#include "tests/common/shell.h"

/* The models: a "cloud" of 3 layers x 4 heads x 8 and an "edge" of 2 layers x 2 heads x 8,
 * and a second edge of another shape for the refusals. One vocabulary. */
#define S_VOCAB 61
#define S_POS   96
#define S_K     40 /* context */
#define S_M     12 /* continuation */
#define S_DOCS  3

static const kvedge_decoder_config_t s_cloud_cfg = {.layers = 3,
                                                    .heads = 4,
                                                    .head_dim = 8,
                                                    .hidden = 32,
                                                    .ffn = 64,
                                                    .vocab = S_VOCAB,
                                                    .max_positions = S_POS};
static const kvedge_decoder_config_t s_edge_cfg = {.layers = 2,
                                                   .heads = 2,
                                                   .head_dim = 8,
                                                   .hidden = 16,
                                                   .ffn = 32,
                                                   .vocab = S_VOCAB,
                                                   .max_positions = S_POS};
static const kvedge_decoder_config_t s_other_cfg = {.layers = 2,
                                                    .heads = 4,
                                                    .head_dim = 4,
                                                    .hidden = 16,
                                                    .ffn = 32,
                                                    .vocab = S_VOCAB,
                                                    .max_positions = S_POS};

static char s_dir[64];
static kvedge_decoder_t *s_cloud, *s_edge, *s_other;
static int32_t s_doc[S_DOCS][S_K + S_M + 1 + 5]; /* a few tokens more than needed */
static int32_t s_calib[512];

static uint64_t s_rng = 0x243f6a8885a308d3ull;

static uint32_t s_rand(uint32_t n)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (uint32_t)(s_rng >> 33) % n;
}

static kvedge_decoder_t *s_model(const char *name, const kvedge_decoder_config_t *c, uint64_t seed)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s.safetensors", s_dir, name);
    assert_int_equal(kvedge_decoder_synthesize(path, c, seed, false), KVEDGE_OK);
    kvedge_decoder_t *md = kvedge_decoder_new();
    assert_non_null(md);
    assert_int_equal(kvedge_decoder_load(md, path, 0), KVEDGE_OK);
    return md;
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-lseval-XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    s_cloud = s_model("cloud", &s_cloud_cfg, 11);
    s_edge = s_model("edge", &s_edge_cfg, 12);
    s_other = s_model("other", &s_other_cfg, 13);
    /* Tokens with some structure (a repeated phrase) so the context matters. */
    for (size_t d = 0; d < S_DOCS; d++)
        for (size_t i = 0; i < sizeof s_doc[d] / sizeof s_doc[d][0]; i++)
            s_doc[d][i] = i % 7 < 3 ? (int32_t)(4 + (i % 7) + d) : (int32_t)s_rand(S_VOCAB);
    for (size_t i = 0; i < sizeof s_calib / sizeof s_calib[0]; i++)
        s_calib[i] = (int32_t)s_rand(S_VOCAB);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    kvedge_decoder_destroy(&s_other);
    kvedge_decoder_destroy(&s_edge);
    kvedge_decoder_destroy(&s_cloud);
    kt_sh("rm -rf %s", s_dir);
    return 0;
}

static void s_opts(kvedge_lseval_opts_t *o, const int32_t **docs, size_t *len)
{
    memset(o, 0, sizeof *o);
    for (size_t d = 0; d < S_DOCS; d++) {
        docs[d] = s_doc[d];
        len[d] = sizeof s_doc[d] / sizeof s_doc[d][0];
    }
    o->cloud = s_cloud;
    o->edge = s_edge;
    o->docs = docs;
    o->doc_len = len;
    o->n_docs = S_DOCS;
    o->ctx_tokens = S_K;
    o->cont_tokens = S_M;
    o->chunk_tokens = 16; /* three chunks, the last short */
}

/* An identity layer map between a model and itself (or any two of equal layer counts). */
static void s_identity_map(kvedge_layermap_t *m, const kvedge_decoder_t *cloud,
                           const kvedge_decoder_t *edge)
{
    memset(m, 0, sizeof *m);
    snprintf(m->cloud_id, sizeof m->cloud_id, "cloud");
    snprintf(m->edge_id, sizeof m->edge_id, "edge");
    m->cloud_layers = kvedge_decoder_config(cloud)->layers;
    m->cloud_hidden = kvedge_decoder_config(cloud)->hidden;
    m->edge_layers = kvedge_decoder_config(edge)->layers;
    m->edge_hidden = kvedge_decoder_config(edge)->hidden;
    m->samples = 256;
    m->cka_min = m->rsa_min = 0.5;
    m->entry = calloc(m->edge_layers, sizeof *m->entry);
    assert_non_null(m->entry);
    for (uint32_t e = 0; e < m->edge_layers; e++) {
        m->entry[e].cloud = (int32_t)(e < m->cloud_layers ? e : m->cloud_layers - 1);
        m->entry[e].cka = m->entry[e].rsa = 1;
    }
}

static kvedge_adapter_t *s_fit(const kvedge_decoder_t *cloud, const kvedge_decoder_t *edge,
                               kvedge_adapt_kind_t kind)
{
    kvedge_layermap_t m;
    s_identity_map(&m, cloud, edge);
    kvedge_adapter_t *a = NULL;
    int rc = kvedge_adapter_fit(cloud, edge, &m, s_calib, sizeof s_calib / sizeof s_calib[0], 256,
                                kind, -1, &a);
    kvedge_layermap_clear(&m);
    if (rc != KVEDGE_OK)
        fail_msg("kvedge_adapter_fit(%s): %s", kvedge_adapt_kind_name(kind), kvedge_strerror(rc));
    return a;
}

/* NLL of tokens[n] after tokens[0..n), computed by a plain prefill of tokens[0..n). */
static double s_prefill_nll(const kvedge_decoder_t *md, const int32_t *tokens, uint32_t n)
{
    float logits[S_VOCAB];
    assert_int_equal(kvedge_decoder_prefill(md, tokens, n, logits, NULL, NULL), KVEDGE_OK);
    double m = logits[0], sum = 0;
    for (int i = 1; i < S_VOCAB; i++)
        m = logits[i] > m ? logits[i] : m;
    for (int i = 0; i < S_VOCAB; i++)
        sum += exp(logits[i] - m);
    return m + log(sum) - logits[tokens[n]];
}

static const kvedge_lseval_row_t *s_row(const kvedge_lseval_result_t *r, const char *name)
{
    for (size_t i = 0; i < r->n_rows; i++)
        if (strcmp(r->row[i].name, name) == 0)
            return &r->row[i];
    fail_msg("no row '%s'", name);
    return NULL;
}

/* ---------------------------------------------------------------- round trip */

static void test_roundtrip(void **state)
{
    (void)state;
    const uint32_t L = 3, H = 2, T = 37, D = 8;
    const size_t n = (size_t)L * H * T * D;
    float *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    float *ko = malloc(n * sizeof *ko), *vo = malloc(n * sizeof *vo);
    assert_true(k && v && ko && vo);
    for (size_t i = 0; i < n; i++) {
        k[i] = (float)s_rand(2001) / 1000.0f - 1.0f;
        v[i] = (float)s_rand(2001) / 500.0f - 2.0f;
    }
    uint64_t bytes = 0, f16 = 0;
    /* Lossless fp32: every bit back; fp16 reference bytes are per (chunk, head) of each layer. */
    assert_int_equal(kvedge_lseval_roundtrip(k, v, L, H, T, D, NULL, KVEDGE_SCHEME_LOSSLESS, 16, ko,
                                             vo, &bytes, &f16),
                     KVEDGE_OK);
    assert_memory_equal(k, ko, n * sizeof *k);
    assert_memory_equal(v, vo, n * sizeof *v);
    assert_int_equal(f16, (uint64_t)L * H * T * D * 2 * 2);
    assert_true(bytes > f16); /* fp32 plus headers (random data: lz4 does not pay) */
    /* int8 on layer 1 only: the others copied unchanged, fewer bytes, a small error. */
    bool use[3] = {false, true, false};
    uint64_t b8 = 0, f8 = 0;
    assert_int_equal(
        kvedge_lseval_roundtrip(k, v, L, H, T, D, use, KVEDGE_SCHEME_INT8, 16, ko, vo, &b8, &f8),
        KVEDGE_OK);
    const size_t lf = (size_t)H * T * D;
    assert_memory_equal(k, ko, lf * sizeof *k);
    assert_memory_equal(k + 2 * lf, ko + 2 * lf, lf * sizeof *k);
    assert_int_equal(f8, f16 / 3);
    assert_true(b8 < f8);
    double err = 0;
    for (size_t i = lf; i < 2 * lf; i++) {
        err = fmax(err, fabs(ko[i] - k[i]));
        err = fmax(err, fabs(vo[i] - v[i]));
    }
    assert_true(err > 0 && err < 4.0 / 255 * 1.01); /* half a step of a 4-wide range at most */
    /* int4 g32: smaller still. In place works. */
    uint64_t b4 = 0;
    memcpy(ko, k, n * sizeof *k);
    memcpy(vo, v, n * sizeof *v);
    assert_int_equal(
        kvedge_lseval_roundtrip(ko, vo, L, H, T, D, use, KVEDGE_SCHEME_INT4, 16, ko, vo, &b4, NULL),
        KVEDGE_OK);
    assert_true(b4 < b8);
    /* Refusals. */
    assert_int_equal(kvedge_lseval_roundtrip(NULL, v, L, H, T, D, NULL, KVEDGE_SCHEME_INT8, 0, ko,
                                             vo, NULL, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(
        kvedge_lseval_roundtrip(k, v, L, H, 0, D, NULL, KVEDGE_SCHEME_INT8, 0, ko, vo, NULL, NULL),
        KVEDGE_EINVAL);
    assert_int_equal(
        kvedge_lseval_roundtrip(k, v, L, H, T, D, NULL, (kvedge_scheme_t)7, 0, ko, vo, NULL, NULL),
        KVEDGE_EINVAL);
    k[5] = NAN;
    assert_int_equal(
        kvedge_lseval_roundtrip(k, v, L, H, T, D, NULL, KVEDGE_SCHEME_INT8, 0, ko, vo, NULL, NULL),
        KVEDGE_EINVAL);
    free(k);
    free(v);
    free(ko);
    free(vo);
}

/* ---------------------------------------------------------------- rows */

static void test_rows_without_adapter(void **state)
{
    (void)state;
    const int32_t *docs[S_DOCS];
    size_t len[S_DOCS];
    kvedge_lseval_opts_t o;
    s_opts(&o, docs, len);
    kvedge_lseval_result_t *r = NULL;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_OK);
    assert_non_null(r);
    assert_int_equal(r->n_docs, S_DOCS);
    assert_int_equal(r->n_rows, 4); /* cloud-only, edge-only, peer-int8, no-context */
    const kvedge_lseval_row_t *cloud = s_row(r, "cloud-only"), *edge = s_row(r, "edge-only");
    const kvedge_lseval_row_t *peer = s_row(r, "peer-int8"), *none = s_row(r, "no-context");
    assert_int_equal(cloud->positions, S_DOCS * S_M);
    /* Cloud-only is the reference: agreement 1 and KL 0 by definition. */
    assert_true(cloud->agree_cloud == 1.0);
    assert_true(cloud->kl == 0.0);
    assert_true(edge->agree_edge == 1.0);
    assert_true(cloud->agree_edge == edge->agree_cloud);
    assert_true(cloud->bytes == 0 && edge->bytes == 0 && none->bytes == 0);
    /* Edge-only and no-context against plain prefills of the edge model. */
    double nll_edge = 0, nll_none = 0;
    for (size_t d = 0; d < S_DOCS; d++)
        for (uint32_t i = 0; i < S_M; i++) {
            nll_edge += s_prefill_nll(s_edge, s_doc[d], S_K + i + 1);
            nll_none += s_prefill_nll(s_edge, s_doc[d] + S_K, i + 1);
        }
    nll_edge /= S_DOCS * S_M;
    nll_none /= S_DOCS * S_M;
    assert_true(fabs(edge->nll - nll_edge) < 1e-5);
    assert_true(fabs(none->nll - nll_none) < 1e-5);
    assert_true(fabs(edge->ppl - exp(nll_edge)) < 1e-4 * edge->ppl);
    /* The cloud too, for its own perplexity. */
    double nll_cloud = 0;
    for (size_t d = 0; d < S_DOCS; d++)
        for (uint32_t i = 0; i < S_M; i++)
            nll_cloud += s_prefill_nll(s_cloud, s_doc[d], S_K + i + 1);
    assert_true(fabs(cloud->nll - nll_cloud / (S_DOCS * S_M)) < 1e-5);
    /* Peer int8: the edge's own context, one int8 block per (chunk, layer, head). */
    assert_true(peer->bytes > 0 && peer->bytes < peer->fp16_bytes);
    assert_true(peer->fp16_bytes ==
                (double)s_edge_cfg.layers * s_edge_cfg.heads * S_K * s_edge_cfg.head_dim * 2 * 2);
    assert_true(fabs(peer->nll - edge->nll) < 1e-2);
    assert_true(peer->kl >= 0 && isfinite(peer->kl));
    /* Output: the table, JSON and the data file mention every row. */
    char path[128];
    snprintf(path, sizeof path, "%s/out.txt", s_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    kvedge_lseval_print(f, r, false);
    kvedge_lseval_print(f, r, true);
    kvedge_lseval_print_dat(f, r);
    fclose(f);
    assert_true(kt_file_has(path, "peer-int8"));
    assert_true(kt_file_has(path, "\"agree_cloud\":1,"));
    assert_true(kt_file_has(path, "3 no-context "));
    free(r);
    /* max_docs and a short document skipped. */
    len[0] = S_K + S_M; /* one short of a target for the last position */
    o.max_docs = 1;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_OK);
    assert_int_equal(r->n_docs, 1);
    assert_int_equal(r->n_short, 1);
    free(r);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    const int32_t *docs[S_DOCS];
    size_t len[S_DOCS];
    kvedge_lseval_opts_t o;
    kvedge_lseval_result_t *r = NULL;
    s_opts(&o, docs, len);
    /* Text too short for one document. */
    for (size_t d = 0; d < S_DOCS; d++)
        len[d] = S_K + S_M;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_EINVAL);
    assert_null(r);
    s_opts(&o, docs, len);
    o.ctx_tokens = S_POS;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_ETOOBIG);
    s_opts(&o, docs, len);
    o.cont_tokens = 0;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_EINVAL);
    s_opts(&o, docs, len);
    o.edge = NULL;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_EINVAL);
    s_opts(&o, docs, len);
    assert_int_equal(kvedge_lseval_run(&o, NULL), KVEDGE_EINVAL);
    /* A token outside the vocabulary. */
    int32_t bad[S_K + S_M + 1];
    memcpy(bad, s_doc[0], sizeof bad);
    bad[3] = S_VOCAB;
    docs[0] = bad;
    len[0] = S_K + S_M + 1;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_EINVAL);
    assert_null(r);
}

/* ---------------------------------------------------------------- with adapters */

static void test_identity_adapter(void **state)
{
    (void)state;
    /* The edge model is the cloud model: a linear adapter fitted on it is about the identity,
     * and head matching picks every head itself with all its channels. */
    kvedge_adapter_t *lin = s_fit(s_cloud, s_cloud, KVEDGE_ADAPT_LINEAR);
    kvedge_adapter_t *hd = s_fit(s_cloud, s_cloud, KVEDGE_ADAPT_HEADS);
    const kvedge_adapter_t *ads[2] = {lin, hd};
    const int32_t *docs[S_DOCS];
    size_t len[S_DOCS];
    kvedge_lseval_opts_t o;
    s_opts(&o, docs, len);
    o.edge = s_cloud;
    o.adapters = ads;
    o.n_adapters = 2;
    kvedge_lseval_result_t *r = NULL;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_OK);
    assert_int_equal(r->n_rows, 4 + 6);
    const kvedge_lseval_row_t *cloud = s_row(r, "cloud-only"), *edge = s_row(r, "edge-only");
    /* Same model both sides: edge-only is cloud-only. */
    assert_true(fabs(edge->nll - cloud->nll) < 1e-6);
    assert_true(edge->agree_cloud == 1.0);
    const char *rows[] = {"ce-lslm least-squares lossless", "ce-lslm heads lossless",
                          "ce-lslm least-squares int8", "ce-lslm heads int8"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const kvedge_lseval_row_t *x = s_row(r, rows[i]);
        double rel = fabs(x->ppl / edge->ppl - 1);
        if (!(rel < 5e-3))
            fail_msg("%s: ppl %.6f against edge-only %.6f (%.3g)", x->name, x->ppl, edge->ppl, rel);
        assert_int_equal(x->layers_adapted, s_cloud_cfg.layers);
        assert_int_equal(x->layers_computed, 0);
        /* Bytes: every cloud layer is mapped, so the cloud's whole context at that precision. */
        assert_true(x->bytes > 0);
        assert_true(x->fp16_bytes == (double)s_cloud_cfg.layers * s_cloud_cfg.heads * S_K *
                                         s_cloud_cfg.head_dim * 2 * 2);
    }
    /* The heads adapter is an exact selection here: lossless gives edge-only's logits. */
    assert_true(s_row(r, "ce-lslm heads lossless")->kl < 1e-9);
    assert_true(s_row(r, "ce-lslm heads int4-g32")->bytes < s_row(r, "ce-lslm heads int8")->bytes);
    free(r);
    kvedge_adapter_destroy(&hd);
    kvedge_adapter_destroy(&lin);
}

static void test_adapter_for_other_models(void **state)
{
    (void)state;
    kvedge_adapter_t *a = s_fit(s_cloud, s_edge, KVEDGE_ADAPT_LINEAR);
    char why[256] = "";
    assert_int_equal(kvedge_lseval_adapter_check(a, s_cloud, s_edge, why, sizeof why), KVEDGE_OK);
    assert_int_equal(kvedge_lseval_adapter_check(a, s_cloud, s_other, why, sizeof why),
                     KVEDGE_ESHAPE);
    assert_non_null(strstr(why, "edge model of 2 layers x 2 KV heads x 8, not 2 x 4 x 4"));
    assert_int_equal(kvedge_lseval_adapter_check(a, s_edge, s_edge, why, sizeof why),
                     KVEDGE_ESHAPE);
    assert_non_null(strstr(why, "cloud model of 3 layers x 4 KV heads x 8"));
    assert_int_equal(kvedge_lseval_adapter_check(NULL, s_cloud, s_edge, why, sizeof why),
                     KVEDGE_EINVAL);
    const kvedge_adapter_t *ads[1] = {a};
    const int32_t *docs[S_DOCS];
    size_t len[S_DOCS];
    kvedge_lseval_opts_t o;
    s_opts(&o, docs, len);
    o.edge = s_other;
    o.adapters = ads;
    o.n_adapters = 1;
    kvedge_lseval_result_t *r = NULL;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_ESHAPE);
    assert_null(r);
    /* The right models: one row group, its name from the kind. */
    o.edge = s_edge;
    assert_int_equal(kvedge_lseval_run(&o, &r), KVEDGE_OK);
    const kvedge_lseval_row_t *x = s_row(r, "ce-lslm least-squares int4-g32");
    assert_int_equal(x->adapter, 0);
    assert_int_equal(x->layers_adapted, s_edge_cfg.layers);
    /* Two edge layers from cloud layers 0 and 1: those two layers' bytes. */
    assert_true(x->fp16_bytes == 2.0 * s_cloud_cfg.heads * S_K * s_cloud_cfg.head_dim * 2 * 2);
    free(r);
    char path[128];
    snprintf(path, sizeof path, "%s/small.adapter", s_dir);
    assert_int_equal(kvedge_adapter_save(a, path), KVEDGE_OK);
    kvedge_adapter_destroy(&a);
}

/* ---------------------------------------------------------------- the command */

#if defined(KVEDGE_BIN) && defined(KVEDGE_MODELS)
static void test_command(void **state)
{
    (void)state;
    const char *edge = KVEDGE_MODELS "/kjv/edge/model.safetensors";
    const char *tok = KVEDGE_MODELS "/kjv";
    char text[128], out[128], err[128], longtext[128];
    snprintf(text, sizeof text, "%s/short.txt", s_dir);
    snprintf(longtext, sizeof longtext, "%s/long.txt", s_dir);
    snprintf(out, sizeof out, "%s/cmd.out", s_dir);
    snprintf(err, sizeof err, "%s/cmd.err", s_dir);
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    fputs("In the beginning God created the heaven and the earth.\n\nAnd the earth was "
          "without form.\n",
          f);
    fclose(f);
    /* Too short for one document: usage, and says how long the text is. */
    assert_int_equal(kt_sh("%s lseval --cloud %s --edge %s --tokenizer %s --text %s --context 32 "
                           "--continuation 8 -q > %s 2> %s",
                           KVEDGE_BIN, edge, edge, tok, text, out, err),
                     2);
    assert_true(kt_file_has(err, "too short for one document"));
    assert_true(kt_file_has(err, "need 41 tokens"));
    /* Missing arguments, bad values. */
    assert_int_equal(kt_sh("%s lseval --cloud %s --text %s 2> %s", KVEDGE_BIN, edge, text, err), 2);
    assert_true(kt_file_has(err, "required"));
    assert_int_equal(
        kt_sh("%s lseval --cloud %s --edge %s --tokenizer %s --file %s --context 0 2> %s",
              KVEDGE_BIN, edge, edge, tok, text, err),
        2);
    assert_true(kt_file_has(err, "--context: '0' is out of range"));
    /* An adapter for other models (the synthesized pair's). */
    assert_int_equal(kt_sh("head -c 20000 %s/kjv/heldout.txt > %s", KVEDGE_MODELS, longtext), 0);
    assert_int_equal(kt_sh("%s lseval --cloud %s --edge %s --tokenizer %s --text %s --adapter "
                           "%s/small.adapter --context 32 --continuation 8 -q 2> %s",
                           KVEDGE_BIN, edge, edge, tok, longtext, s_dir, err),
                     2);
    assert_true(kt_file_has(err, "does not fit these models"));
    /* A file that is no adapter. */
    assert_int_equal(kt_sh("%s lseval --cloud %s --edge %s --tokenizer %s --text %s --adapter %s "
                           "--context 32 --continuation 8 -q 2> %s",
                           KVEDGE_BIN, edge, edge, tok, longtext, text, err),
                     4);
    /* A run: the KJV edge model against itself, two documents, JSON. */
    assert_int_equal(kt_sh("%s lseval --cloud %s --edge %s --tokenizer %s --text %s --context 32 "
                           "--continuation 8 --docs 2 -q --json --dat %s/rows.dat > %s 2> %s",
                           KVEDGE_BIN, edge, edge, tok, longtext, s_dir, out, err),
                     0);
    assert_true(kt_file_has(out, "\"documents\":2,"));
    assert_true(kt_file_has(out, "\"name\":\"edge-only\""));
    char dat[160];
    snprintf(dat, sizeof dat, "%s/rows.dat", s_dir);
    assert_true(kt_file_has(dat, "2 peer-int8 "));
    /* Help. */
    assert_int_equal(kt_sh("%s lseval --help > %s", KVEDGE_BIN, out), 0);
    assert_true(kt_file_has(out, "--adapter FILE"));
    assert_int_equal(kt_sh("%s --help > %s", KVEDGE_BIN, out), 0);
    assert_true(kt_file_has(out, "lseval"));
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_rows_without_adapter),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_identity_adapter),
        cmocka_unit_test(test_adapter_for_other_models),
#if defined(KVEDGE_BIN) && defined(KVEDGE_MODELS)
        cmocka_unit_test(test_command), /* after the adapter tests: uses their file */
#endif
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
