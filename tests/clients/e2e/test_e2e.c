/* End to end (clients/e2e/e2e.h) with the tiny fixture model on loopback topologies: a cloud
 * prefill fetched losslessly through a proxy gives the logits of a full local recompute;
 * int8/int4 stay within their bounds; cloud, peer, historical and mixed sources give
 * bit-identical logits; missing layers and a dead source are recomputed; the prompt never
 * crosses the wire (a spy on both hops, with a positive control); bad input is refused.
 *
 * Every store topology runs with a Storage Master: the proxy learns the fixture's model
 * record ("opt-tiny", not built in) from it. */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cblas.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <czmq.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "access/frame.h"
#include "store/master/master.h"
#include "runtime/mview.h"
#include "store/node/node.h"
#include "clients/decoder/decoder.h"
#include "clients/e2e/e2e.h"
#include "clients/lib/kvedge.h"
#include "clients/lib/pipeline.h"
#include "proxy/proxy.h"
#include "tests/common/testutil.h"

#define S_WEIGHTS  KVEDGE_FIXTURES "/opt_tiny.safetensors"
#define S_MODEL_ID "opt-tiny"
#define S_CTX      96 /* shared context tokens */
#define S_CHUNK    32 /* tokens per chunk */
#define S_NCHUNK   (S_CTX / S_CHUNK)
#define S_PROMPT   24 /* the user's prompt: the 24 bytes of s_prompt_text */
#define S_NEW      8  /* greedy tokens per decode */
#define S_MAXL     8  /* layers the fixed arrays hold (the fixture has 3) */
#define S_DEADLINE 10000
/* Source down: the request's deadline (every layer comes back as a miss by then). */
#define S_DOWN_DEADLINE 2000

/* Same bounds as tests/clients/decoder/test_decoder.c, for the same reasons: lossless context K/V
 * vs recomputing it differs only by fp32 rounding (log-sum-exp merge vs one softmax); quantized
 * context K/V measured int8 ~5e-3, int4 ~7e-2 there (fp32 source; fp16 here adds ~1e-3
 * relative per element, far below the int8 step). */
#define S_TOL_LOSSLESS 1e-5f
#define S_TOL_INT8     2e-2f
#define S_TOL_INT4     2.5e-1f

/* The distinctive prompt: 24 distinct bytes, ids byte + KVEDGE_E2E_BYTE_TOKEN_BASE (the
 * stand-in byte tokenizer's mapping; the fixture's vocabulary of 256 is too small for
 * kvedge_e2e_byte_tokens itself, so the test maps it). The context never uses these ids. */
static const char s_prompt_text[S_PROMPT + 1] = "Zq7#Vx!Kp9@Lw2$Jt5%Hr8&M";
/* Consecutive prompt ids (or text bytes) a leak detector looks for: short enough to catch a
 * partial leak, long enough (>= 8 bytes in every encoding) never to match by chance. */
#define S_LEAK_WINDOW 8

/* ---------------------------------------------------------------- shared fixture */

static struct {
    kvedge_decoder_t *dec;
    const kvedge_decoder_config_t *c;
    kvedge_model_t model;
    int32_t ctx[S_CTX];
    int32_t prompt[S_PROMPT];
    kvedge_chunk_id_t ids[S_NCHUNK];
    float *ck, *cv; /* the context's K/V by prefill, [layers][heads][S_CTX][head_dim] */
    size_t kvf;     /* floats per layer */
    float *ref;     /* full local recompute: the prompt's last logits */
    int32_t ref_tok[S_NEW];
    float pre_diff; /* prefill(ctx + prompt) last logits vs ref */
} s_fx;

static float s_max_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) /* NaN counts as infinitely wrong */
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* Runs a decoder session (provider NULL: ctx_len must be 0): the prompt's last logits (vocab
 * floats) and S_NEW greedy tokens. Returns begin's code. */
static int s_session(kvedge_decoder_kv_fn provider, void *arg, const int32_t *ctx, uint32_t ctx_len,
                     const int32_t *prompt, uint32_t prompt_len, float *logits, int32_t *tokens)
{
    kvedge_decoder_session_t *s = kvedge_decoder_session_new(s_fx.dec);
    assert_non_null(s);
    int rc = kvedge_decoder_session_begin(s, ctx, ctx_len, provider, arg, prompt, prompt_len, S_NEW,
                                          logits);
    if (rc == KVEDGE_OK)
        assert_int_equal(kvedge_decoder_session_generate(s, S_NEW, tokens), KVEDGE_OK);
    kvedge_decoder_session_destroy(&s);
    return rc;
}

/* The context's K/V straight from the prefill arrays (no store, no wire). */
static int s_direct_provide(void *arg, uint32_t layer, float *k, float *v)
{
    (void)arg;
    memcpy(k, s_fx.ck + layer * s_fx.kvf, s_fx.kvf * sizeof(float));
    memcpy(v, s_fx.cv + layer * s_fx.kvf, s_fx.kvf * sizeof(float));
    return 0;
}

static int s_setup(void **state)
{
    (void)state;
    s_fx.dec = kvedge_decoder_new();
    assert_non_null(s_fx.dec);
    int rc = kvedge_decoder_load(s_fx.dec, S_WEIGHTS, 0);
    if (rc != KVEDGE_OK)
        fail_msg("load %s: %s (%s)", S_WEIGHTS, kvedge_strerror(rc),
                 kvedge_decoder_error(s_fx.dec));
    s_fx.c = kvedge_decoder_config(s_fx.dec);
    assert_true(s_fx.c->layers <= S_MAXL);
    assert_true(S_CTX + S_PROMPT + S_NEW <= s_fx.c->max_positions);
    assert_int_equal(kvedge_e2e_model(s_fx.dec, S_MODEL_ID, &s_fx.model), KVEDGE_OK);

    /* The prompt's ids, and a context that avoids them. */
    bool used[4096] = {false};
    assert_true(s_fx.c->vocab <= 4096);
    for (uint32_t i = 0; i < S_PROMPT; i++) {
        s_fx.prompt[i] = (uint8_t)s_prompt_text[i] + KVEDGE_E2E_BYTE_TOKEN_BASE;
        assert_true(s_fx.prompt[i] < (int32_t)s_fx.c->vocab);
        assert_false(used[s_fx.prompt[i]]); /* distinct */
        used[s_fx.prompt[i]] = true;
    }
    uint64_t x = 0x5eed;
    for (uint32_t i = 0; i < S_CTX; i++) {
        int32_t t;
        do {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            t = (int32_t)(KVEDGE_E2E_BYTE_TOKEN_BASE +
                          (x >> 33) % (s_fx.c->vocab - KVEDGE_E2E_BYTE_TOKEN_BASE));
        } while (used[t]);
        s_fx.ctx[i] = t;
    }
    size_t n;
    assert_int_equal(
        kvedge_e2e_chunks(&s_fx.model, s_fx.ctx, S_CTX, S_CHUNK, s_fx.ids, S_NCHUNK, &n),
        KVEDGE_OK);
    assert_int_equal(n, S_NCHUNK);

    s_fx.kvf = kvedge_decoder_kv_floats(s_fx.dec, S_CTX);
    s_fx.ck = malloc(s_fx.c->layers * s_fx.kvf * sizeof(float));
    s_fx.cv = malloc(s_fx.c->layers * s_fx.kvf * sizeof(float));
    s_fx.ref = malloc(s_fx.c->vocab * sizeof(float));
    assert_true(s_fx.ck && s_fx.cv && s_fx.ref);
    assert_int_equal(kvedge_decoder_prefill(s_fx.dec, s_fx.ctx, S_CTX, NULL, s_fx.ck, s_fx.cv),
                     KVEDGE_OK);

    /* Full local recompute: context and prompt as one local sequence. */
    int32_t all[S_CTX + S_PROMPT];
    memcpy(all, s_fx.ctx, sizeof s_fx.ctx);
    memcpy(all + S_CTX, s_fx.prompt, sizeof s_fx.prompt);
    assert_int_equal(s_session(NULL, NULL, NULL, 0, all, S_CTX + S_PROMPT, s_fx.ref, s_fx.ref_tok),
                     KVEDGE_OK);
    float *pre = malloc(s_fx.c->vocab * sizeof(float));
    assert_non_null(pre);
    assert_int_equal(kvedge_decoder_prefill(s_fx.dec, all, S_CTX + S_PROMPT, pre, NULL, NULL),
                     KVEDGE_OK);
    s_fx.pre_diff = s_max_diff(pre, s_fx.ref, s_fx.c->vocab);
    assert_true(s_fx.pre_diff <= S_TOL_LOSSLESS);
    free(pre);
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    free(s_fx.ref);
    free(s_fx.cv);
    free(s_fx.ck);
    kvedge_decoder_destroy(&s_fx.dec);
    return 0;
}

/* ---------------------------------------------------------------- topology */

/* A test's world: a temp dir, a master that holds the fixture's model record. */
typedef struct {
    char root[64];
    char dir[200], ep[200], pub[200];
    kvedge_master_opts_t opts;
    kvedge_master_t *master;
    kvedge_mview_t *reg; /* the test's own view: registers the model record */
} s_env_t;

static void s_env_start(s_env_t *e)
{
    memset(e, 0, sizeof *e);
    snprintf(e->root, sizeof e->root, "/tmp/kvedge-e2e-XXXXXX");
    assert_non_null(mkdtemp(e->root));
    snprintf(e->dir, sizeof e->dir, "%s/master", e->root);
    snprintf(e->ep, sizeof e->ep, "ipc://%s/m.sock", e->root);
    snprintf(e->pub, sizeof e->pub, "ipc://%s/mp.sock", e->root);
    kvedge_master_opts_default(&e->opts);
    e->opts.bind = e->ep;
    e->opts.pub = e->pub;
    e->opts.data_dir = e->dir;
    e->opts.insecure = true;
    assert_int_equal(kvedge_master_start(&e->opts, &e->master, NULL, 0), KVEDGE_OK);
    kvedge_mview_opts_t vo;
    kvedge_mview_opts_default(&vo);
    vo.master = e->ep;
    vo.pub = e->pub;
    vo.prefix = "model/";
    assert_int_equal(kvedge_mview_start(&vo, &e->reg), KVEDGE_OK);
    uint8_t body[KVEDGE_MASTER_RECORD_MAX_BYTES];
    size_t len;
    assert_int_equal(kvedge_master_model_pack(&s_fx.model, body, &len), KVEDGE_OK);
    char key[200];
    snprintf(key, sizeof key, "model/%s", s_fx.model.id);
    assert_int_equal(kvedge_mview_set(e->reg, key, body, len, 3000), KVEDGE_OK);
}

static void s_env_stop(s_env_t *e)
{
    kvedge_mview_destroy(&e->reg);
    kvedge_master_destroy(&e->master);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", e->root);
    assert_int_equal(system(cmd), 0);
}

/* A store node in this process; with_dir: it registers with the master and publishes which
 * layers it holds (the proxy's block directory). */
typedef struct {
    char dir[200], ep[250];
    kvedge_node_t *node;
    kvedge_engine_t *engine; /* the node's */
} s_node_t;

static void s_node_start(s_node_t *n, const s_env_t *e, const char *name, kvedge_role_t role,
                         bool with_dir)
{
    memset(n, 0, sizeof *n);
    snprintf(n->dir, sizeof n->dir, "%s/%s", e->root, name);
    snprintf(n->ep, sizeof n->ep, "ipc://%s.sock", n->dir);
    kvedge_node_settings_t ns;
    kvedge_node_settings_default(&ns);
    snprintf(ns.metrics, sizeof ns.metrics, "off");
    ns.role = role;
    ns.insecure = true;
    ns.workers = 2;
    snprintf(ns.data, sizeof ns.data, "%s", n->dir);
    snprintf(ns.bind, sizeof ns.bind, "%s", n->ep);
    snprintf(ns.name, sizeof ns.name, "%s", name);
    if (with_dir) {
        snprintf(ns.master, sizeof ns.master, "%s", e->ep);
        snprintf(ns.master_pub, sizeof ns.master_pub, "%s", e->pub);
        snprintf(ns.node_id, sizeof ns.node_id, "%s", name);
        ns.dir_interval_ms = 100;
    }
    char why[256];
    if (kvedge_node_start(&ns, &n->node, why, sizeof why) != KVEDGE_OK)
        fail_msg("start %s: %s", name, why);
    n->engine = kvedge_node_engine(n->node);
}

static void s_node_stop(s_node_t *n)
{
    kvedge_node_destroy(&n->node);
}

/* A cloud node in its own process (kvedge store), so it can be killed. */
static pid_t s_spawn_cloud(const s_env_t *e, const char *ep)
{
    char data[200];
    snprintf(data, sizeof data, "%s/cloud-proc", e->root);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], STDOUT_FILENO);
        execl(KVEDGE_BIN, "kvedge", "--data", data, "store", "--role", "cloud", "--insecure",
              "--bind", ep, "--log-level", "error", "--metrics", "off", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char line[300];
    ssize_t r = read(pfd[0], line, sizeof line); /* it prints once it serves */
    close(pfd[0]);
    assert_true(r > 0);
    return pid;
}

static kvedge_client_t *s_client(const char *ep, int deadline_ms)
{
    kvedge_client_opts_t o;
    kvedge_client_opts_default(&o);
    o.endpoint = ep;
    o.deadline_ms = deadline_ms;
    kvedge_client_t *c = NULL;
    int rc = kvedge_client_connect(&o, &c);
    if (rc != KVEDGE_OK)
        fail_msg("connect %s: %s", ep, kvedge_strerror(rc));
    return c;
}

/* A proxy at root/<name>.sock over the given source specs, with the env's master; waits
 * until `ready` sources are usable. */
static kvedge_proxy_t *s_proxy(const s_env_t *e, const char *name, const char *const *specs,
                               size_t n, size_t ready, char *ep, size_t ep_len)
{
    kvedge_proxy_source_t src[4];
    assert_true(n <= 4);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(kvedge_proxy_source_parse(specs[i], &src[i]), KVEDGE_OK);
    snprintf(ep, ep_len, "ipc://%s/%s.sock", e->root, name);
    kvedge_proxy_opts_t po;
    kvedge_proxy_opts_default(&po);
    po.bind = ep;
    po.insecure = true;
    po.id = name;
    po.sources = src;
    po.nsources = n;
    po.master = e->ep;
    po.master_pub = e->pub;
    char why[256];
    kvedge_proxy_t *p = NULL;
    if (kvedge_proxy_start(&po, &p, why, sizeof why) != KVEDGE_OK)
        fail_msg("proxy %s: %s", name, why);
    assert_int_equal(kvedge_proxy_wait_sources(p, ready, 5000), KVEDGE_OK);
    /* Its plans see the master's directory as it is now: its view has caught up. */
    if (e->master)
        assert_int_equal(kvedge_proxy_wait_view(p, kvedge_master_seq(e->master), KT_WAIT_MS),
                         KVEDGE_OK);
    return p;
}

/* ---------------------------------------------------------------- putting the context */

static void s_quant(kvedge_e2e_quant_t *q, kvedge_scheme_t scheme, kvedge_dtype_t dtype, bool pin)
{
    kvedge_e2e_quant_default(q);
    q->scheme = scheme;
    q->dtype = dtype;
    q->pin = pin;
}

/* The cloud role: kvedge_e2e_prefill to the node at ep. */
static void s_prefill(const char *ep, const kvedge_e2e_quant_t *q, kvedge_e2e_prefill_stats_t *st)
{
    kvedge_client_t *c = s_client(ep, S_DEADLINE);
    kvedge_chunk_id_t ids[S_NCHUNK + 1];
    kvedge_e2e_prefill_stats_t local;
    if (!st)
        st = &local;
    int rc = kvedge_e2e_prefill(c, s_fx.dec, &s_fx.model, s_fx.ctx, S_CTX, S_CHUNK, q, ids,
                                S_NCHUNK + 1, st);
    if (rc != KVEDGE_OK)
        fail_msg("prefill to %s: %s", ep, kvedge_strerror(rc));
    assert_int_equal(st->n_chunks, S_NCHUNK);
    assert_memory_equal(ids, s_fx.ids, sizeof s_fx.ids); /* the edge computes the same chain */
    assert_int_equal(st->blocks, (uint64_t)S_NCHUNK * s_fx.c->layers * s_fx.c->heads);
    assert_true(st->bytes > 0);
    kvedge_client_destroy(&c);
}

/* Puts layers [l0, l1) of the context (fp32 source as scheme: lossless, int8 or int4, encoded
 * here, not by kvedge_e2e) to the node at ep, after registering the model there. */
static void s_put_layers_as(const char *ep, uint32_t l0, uint32_t l1, kvedge_scheme_t scheme)
{
    const uint32_t H = s_fx.c->heads, D = s_fx.c->head_dim;
    kvedge_client_t *c = s_client(ep, S_DEADLINE);
    assert_int_equal(kvedge_client_put_model(c, &s_fx.model), KVEDGE_OK);
    kvedge_block_spec_t spec = {KVEDGE_DTYPE_FP32, scheme, S_CHUNK, (uint16_t)D, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec);
    assert_true(cap > 0);
    uint8_t *blk = malloc(H * cap);
    float *k = malloc((size_t)S_CHUNK * D * sizeof(float)),
          *v = malloc((size_t)S_CHUNK * D * sizeof(float));
    kvedge_put_item_t *items = calloc(H, sizeof *items);
    assert_true(blk && k && v && items);
    for (uint32_t l = l0; l < l1; l++)
        for (uint32_t ci = 0; ci < S_NCHUNK; ci++) {
            for (uint32_t h = 0; h < H; h++) {
                size_t off = l * s_fx.kvf + ((size_t)h * S_CTX + (size_t)ci * S_CHUNK) * D;
                memcpy(k, s_fx.ck + off, (size_t)S_CHUNK * D * sizeof(float));
                memcpy(v, s_fx.cv + off, (size_t)S_CHUNK * D * sizeof(float));
                kvedge_put_item_t *it = &items[h];
                memset(it, 0, sizeof *it);
                assert_int_equal(kvedge_block_encode(&spec, k, v, blk + h * cap, cap, &it->len),
                                 KVEDGE_OK);
                it->block = blk + h * cap;
                it->chunk.id = s_fx.ids[ci];
                it->chunk.has_parent = ci > 0;
                if (ci > 0)
                    it->chunk.parent = s_fx.ids[ci - 1];
                snprintf(it->chunk.model_id, sizeof it->chunk.model_id, "%s", s_fx.model.id);
                it->chunk.index = ci;
                it->chunk.tokens = S_CHUNK;
                it->layer = (uint16_t)l;
                it->head = (uint16_t)h;
            }
            assert_int_equal(kvedge_client_put(c, items, H, NULL), KVEDGE_OK);
        }
    free(items);
    free(v);
    free(k);
    free(blk);
    kvedge_client_destroy(&c);
}

static void s_put_layers(const char *ep, uint32_t l0, uint32_t l1)
{
    s_put_layers_as(ep, l0, l1, KVEDGE_SCHEME_LOSSLESS);
}

/* ---------------------------------------------------------------- the edge */

/* kvedge_e2e_decode of the fixture's context and prompt; logits (vocab floats, may be NULL)
 * receives the prompt's last logits. res must be allocated. */
static int s_e2e(kvedge_e2e_mode_t mode, kvedge_client_t *proxy, bool plan_recompute,
                 int deadline_ms, kvedge_e2e_cloud_t *cloud, int32_t *tokens, float *logits,
                 kvedge_e2e_result_t *res)
{
    kvedge_e2e_request_t rq = {
        .mode = mode,
        .decoder = s_fx.dec,
        .ctx = s_fx.ctx,
        .ctx_len = S_CTX,
        .prompt = s_fx.prompt,
        .prompt_len = S_PROMPT,
        .max_new = S_NEW,
        .proxy = proxy,
        .model = &s_fx.model,
        .chunk_tokens = S_CHUNK,
        .plan_recompute = plan_recompute,
        .deadline_ms = deadline_ms,
        .cloud = cloud,
        .logits = logits,
    };
    return kvedge_e2e_decode(&rq, tokens, res);
}

/* A cloud node named name holding the fixture's context, lossless fp32 (st may be NULL). */
static void s_lossless_cloud(const s_env_t *e, s_node_t *cloud, const char *name,
                             kvedge_e2e_prefill_stats_t *st)
{
    s_node_start(cloud, e, name, KVEDGE_ROLE_CLOUD, false);
    kvedge_e2e_quant_t q;
    s_quant(&q, KVEDGE_SCHEME_LOSSLESS, KVEDGE_DTYPE_FP32, false);
    s_prefill(cloud->ep, &q, st);
}

static kvedge_e2e_result_t *s_result(void)
{
    kvedge_e2e_result_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    return r;
}

static float *s_logits(void)
{
    float *l = malloc(s_fx.c->vocab * sizeof(float));
    assert_non_null(l);
    return l;
}

/* A kvedge-mode result: the layers' accounting adds up, and each layer was computed exactly
 * when computed_mask says. */
static void s_check_layers(const kvedge_e2e_result_t *r, uint32_t computed_mask)
{
    assert_int_equal(r->mode, KVEDGE_E2E_KVEDGE);
    assert_int_equal(r->layers, s_fx.c->layers);
    assert_int_equal(r->generated, S_NEW);
    assert_int_equal(r->prompt_bytes_sent, 0);
    assert_int_equal(r->fetched + r->computed, r->layers);
    uint32_t computed = 0;
    for (uint32_t l = 0; l < r->layers; l++) {
        bool want = (computed_mask >> l) & 1u;
        if (r->layer[l].computed != want)
            fail_msg("layer %u: computed %d, expected %d (source '%s', reason %s)", l,
                     r->layer[l].computed, want, r->layer[l].source,
                     kvedge_fetch_reason_name(r->layer[l].reason));
        computed += r->layer[l].computed;
        if (r->layer[l].computed)
            assert_int_equal(r->layer[l].kind, -1);
        else
            assert_true(r->layer[l].source[0] != '\0');
        /* Cores are yielded only for a fetched layer with a next one still on its way. */
        assert_true(r->layer[l].blas_threads >= 1);
        if (r->layer[l].yielded)
            assert_true(!r->layer[l].computed && l + 1 < r->layers);
    }
    assert_int_equal(computed, r->computed);
}

/* The layers fed back as compute samples: fetched, not yielded, not the last. */
static uint64_t s_compute_samples(const kvedge_e2e_result_t *r)
{
    uint64_t n = 0;
    for (uint32_t l = 0; l + 1 < r->layers; l++)
        n += !r->layer[l].computed && !r->layer[l].yielded;
    return n;
}

/* ---------------------------------------------------------------- 1. lossless */

/* Cloud prefill lossless fp32, edge decode through a proxy whose only source is that cloud:
 * the context K/V arrives bit-exact (logits identical to a session fed the prefill's K/V
 * directly), so the logits match a full local recompute within fp32 rounding and the greedy
 * tokens are the same. The edge-only and cloud-only baselines and a store node without a
 * proxy give the same. */
static void test_lossless_matches_local(void **state)
{
    (void)state;
    const uint32_t V = s_fx.c->vocab;
    s_env_t e;
    s_env_start(&e);
    s_node_t cloud;
    kvedge_e2e_prefill_stats_t st;
    s_lossless_cloud(&e, &cloud, "cloud1", &st);
    /* fp32 lossless: more than the fp16 size (lz4 gains little on random weights). */
    assert_true(st.bytes > st.fp16_bytes);

    char spec[400], pep[300];
    snprintf(spec, sizeof spec, "cloud cloud1 %s", cloud.ep);
    const char *specs[] = {spec};
    kvedge_proxy_t *p = s_proxy(&e, "proxy", specs, 1, 1, pep, sizeof pep);
    kvedge_client_t *pc = s_client(pep, S_DEADLINE);

    kvedge_e2e_result_t *r = s_result();
    float *got = s_logits(), *direct = s_logits(), *other = s_logits();
    int32_t tok[S_NEW], direct_tok[S_NEW];
    kvedge_decoder_forget(s_fx.dec);
    int rc = s_e2e(KVEDGE_E2E_KVEDGE, pc, false, S_DEADLINE, NULL, tok, got, r);
    if (rc != KVEDGE_OK)
        fail_msg("decode: %s", kvedge_strerror(rc));
    s_check_layers(r, 0);
    /* Every layer but the last (it holds the output head) and those computed on yielded
     * cores went back as a compute sample. */
    kvedge_decoder_speed_t sp;
    assert_int_equal(kvedge_decoder_speed(s_fx.dec, &sp), KVEDGE_OK);
    assert_int_equal(sp.compute_samples, s_compute_samples(r));
    assert_int_equal(sp.recompute_samples, 0);
    assert_true(r->have_plan);
    for (uint32_t l = 0; l < r->layers; l++) {
        assert_string_equal(r->layer[l].source, "cloud1");
        assert_int_equal(r->layer[l].kind, KVEDGE_PLAN_CLOUD);
        assert_int_equal(r->layer[l].reason, KVEDGE_FETCH_PLANNED);
        assert_true(r->layer[l].ready_us <= r->layer[l].done_us);
    }
    assert_true(r->ttft_us > 0 && r->ttft_us <= r->total_us);
    assert_true(r->sent_bytes > 0 && r->received_bytes >= st.bytes);
    assert_true(r->weights_bytes > 0);
    assert_memory_equal(tok, s_fx.ref_tok, sizeof tok);

    /* The wire changed no bit: the same logits as a session handed the prefill's K/V. */
    assert_int_equal(s_session(s_direct_provide, NULL, s_fx.ctx, S_CTX, s_fx.prompt, S_PROMPT,
                               direct, direct_tok),
                     KVEDGE_OK);
    assert_memory_equal(got, direct, V * sizeof(float));
    assert_memory_equal(direct_tok, s_fx.ref_tok, sizeof direct_tok);
    float d = s_max_diff(got, s_fx.ref, V);
    printf("  lossless fp32 via proxy: max |logit diff| vs full local recompute %.3g (tol %.0e), "
           "bit-identical to the prefill's own K/V; prefill vs session %.3g; %llu block bytes "
           "(fp16 %llu)\n",
           d, S_TOL_LOSSLESS, s_fx.pre_diff, (unsigned long long)st.bytes,
           (unsigned long long)st.fp16_bytes);
    assert_true(d <= S_TOL_LOSSLESS);

    /* The next request plans with what was learned: taught 4x the calibration, the decoder's
     * estimates are 4x, and the proxy prices recomputing everything with them. */
    float cu0, ru0, cu, ru;
    kvedge_decoder_forget(s_fx.dec);
    assert_int_equal(kvedge_decoder_estimate(s_fx.dec, S_CTX, S_PROMPT, &cu0, &ru0), KVEDGE_OK);
    for (int i = 0; i < 2 * KVEDGE_DECODER_LEARN_SAMPLES; i++)
        assert_int_equal(kvedge_decoder_observe(s_fx.dec, S_CTX, S_PROMPT, 4.0 * cu0, 4.0 * ru0),
                         KVEDGE_OK);
    assert_int_equal(kvedge_decoder_estimate(s_fx.dec, S_CTX, S_PROMPT, &cu, &ru), KVEDGE_OK);
    assert_true(fabs(cu / (4.0 * cu0) - 1) < 0.02 && fabs(ru / (4.0 * ru0) - 1) < 0.02);

    /* The proxy may plan layers as recomputation: whatever it chooses, same tokens. */
    rc = s_e2e(KVEDGE_E2E_KVEDGE, pc, true, S_DEADLINE, NULL, tok, other, r);
    assert_int_equal(rc, KVEDGE_OK);
    assert_true(r->have_plan);
    const double all = (double)r->layers * ((double)cu + ru);
    if (!(fabs(r->plan.recompute_all_us / all - 1) < 0.01))
        fail_msg("plan's recompute-all %.1f us, the learned estimates give %.1f us",
                 r->plan.recompute_all_us, all);
    assert_int_equal(kvedge_decoder_speed(s_fx.dec, &sp), KVEDGE_OK);
    assert_true(sp.compute_samples + sp.recompute_samples > 2 * KVEDGE_DECODER_LEARN_SAMPLES);
    assert_int_equal(r->fetched + r->computed, r->layers);
    for (uint32_t l = 0; l < r->layers; l++)
        if (r->layer[l].computed)
            assert_true(r->layer[l].reason == KVEDGE_FETCH_RECOMPUTE ||
                        r->layer[l].reason == KVEDGE_FETCH_MISS ||
                        r->layer[l].reason == KVEDGE_FETCH_MISS_DEADLINE);
    assert_memory_equal(tok, s_fx.ref_tok, sizeof tok);
    float drc = s_max_diff(other, s_fx.ref, V);
    assert_true(drc <= S_TOL_LOSSLESS);
    printf("  with recompute planning: %u fetched, %u computed, max |logit diff| %.3g\n",
           r->fetched, r->computed, drc);

    /* People's and JSON output. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    kvedge_e2e_print(f, r, true);
    fclose(f);
    cJSON *js = cJSON_Parse(buf);
    assert_non_null(js);
    assert_true(cJSON_IsObject(js));
    cJSON_Delete(js);
    free(buf);
    f = open_memstream(&buf, &len);
    assert_non_null(f);
    kvedge_e2e_print(f, r, false);
    fclose(f);
    assert_true(len > 0);
    free(buf);

    /* Edge-only recomputes everything; cloud-only decodes the prompt in the (emulated)
     * cloud on its prefix cache; a store node without a proxy streams GET_LAYER. */
    kvedge_decoder_forget(s_fx.dec);
    assert_int_equal(s_e2e(KVEDGE_E2E_LOCAL, NULL, false, 0, NULL, tok, other, r), KVEDGE_OK);
    assert_int_equal(r->mode, KVEDGE_E2E_LOCAL);
    assert_int_equal(r->generated, S_NEW);
    /* Edge-only: each layer but the last split between the two kinds. */
    assert_int_equal(kvedge_decoder_speed(s_fx.dec, &sp), KVEDGE_OK);
    assert_int_equal(sp.compute_samples, r->layers - 1);
    assert_int_equal(sp.recompute_samples, r->layers - 1);
    assert_true(sp.compute >= KVEDGE_DECODER_LEARN_MIN && sp.compute <= KVEDGE_DECODER_LEARN_MAX);
    assert_int_equal(r->computed, r->layers);
    assert_int_equal(r->prompt_bytes_sent, 0);
    assert_int_equal(r->sent_bytes, 0);
    assert_memory_equal(tok, s_fx.ref_tok, sizeof tok);
    float dlocal = s_max_diff(other, s_fx.ref, V);
    assert_true(dlocal <= S_TOL_LOSSLESS);
    kvedge_e2e_cloud_t *cm = NULL;
    assert_int_equal(kvedge_e2e_cloud_new(s_fx.dec, s_fx.ctx, S_CTX, NULL, &cm), KVEDGE_OK);
    assert_int_equal(s_e2e(KVEDGE_E2E_CLOUD_ONLY, NULL, false, 0, cm, tok, other, r), KVEDGE_OK);
    assert_int_equal(r->mode, KVEDGE_E2E_CLOUD_ONLY);
    assert_int_equal(r->prompt_bytes_sent, (uint64_t)S_PROMPT * KVEDGE_E2E_TOKEN_WIRE_BYTES);
    assert_int_equal(r->weights_bytes, 0);
    assert_memory_equal(tok, s_fx.ref_tok, sizeof tok);
    assert_memory_equal(other, direct, V * sizeof(float)); /* the same K/V, in the cloud */
    kvedge_e2e_cloud_destroy(&cm);
    kvedge_e2e_cloud_destroy(&cm);
    assert_null(cm);
    kvedge_client_t *nc = s_client(cloud.ep, S_DEADLINE);
    assert_int_equal(s_e2e(KVEDGE_E2E_KVEDGE, nc, false, S_DEADLINE, NULL, tok, other, r),
                     KVEDGE_OK);
    assert_int_equal(r->fetched, r->layers);
    assert_false(r->have_plan);
    assert_memory_equal(tok, s_fx.ref_tok, sizeof tok);
    assert_memory_equal(other, direct, V * sizeof(float));
    kvedge_client_destroy(&nc);
    printf("  edge-only: max |logit diff| %.3g; cloud-only and store-node GET_LAYER: "
           "bit-identical to the proxy path\n",
           dlocal);

    free(other);
    free(direct);
    free(got);
    free(r);
    kvedge_client_destroy(&pc);
    kvedge_proxy_destroy(&p);
    s_node_stop(&cloud);
    s_env_stop(&e);
}

/* ---------------------------------------------------------------- 2. quantized */

/* int8 and int4 context K/V (fp16 source): logits within the stated bounds of the full
 * recompute, int8 closer than int4, and fewer bytes than fp16. */
static void test_quantized_within_bounds(void **state)
{
    (void)state;
    const kvedge_scheme_t schemes[] = {KVEDGE_SCHEME_INT8, KVEDGE_SCHEME_INT4};
    const char *names[] = {"cloud8", "cloud4"};
    const float tols[] = {S_TOL_INT8, S_TOL_INT4};
    float errs[2];
    s_env_t e;
    s_env_start(&e);
    float *got = s_logits();
    kvedge_e2e_result_t *r = s_result();
    for (int si = 0; si < 2; si++) {
        s_node_t cloud;
        s_node_start(&cloud, &e, names[si], KVEDGE_ROLE_CLOUD, false);
        kvedge_e2e_quant_t q;
        s_quant(&q, schemes[si], KVEDGE_DTYPE_FP16, false);
        kvedge_e2e_prefill_stats_t st;
        s_prefill(cloud.ep, &q, &st);
        assert_true(st.bytes < st.fp16_bytes);
        char spec[400], pep[300], pname[32];
        snprintf(spec, sizeof spec, "cloud %s %s", names[si], cloud.ep);
        snprintf(pname, sizeof pname, "proxy-%s", names[si]);
        const char *specs[] = {spec};
        kvedge_proxy_t *p = s_proxy(&e, pname, specs, 1, 1, pep, sizeof pep);
        kvedge_client_t *pc = s_client(pep, S_DEADLINE);

        int32_t tok[S_NEW];
        int rc = s_e2e(KVEDGE_E2E_KVEDGE, pc, false, S_DEADLINE, NULL, tok, got, r);
        if (rc != KVEDGE_OK)
            fail_msg("decode %s: %s", kvedge_scheme_name(schemes[si]), kvedge_strerror(rc));
        s_check_layers(r, 0);
        float d = s_max_diff(got, s_fx.ref, s_fx.c->vocab);
        int same = 0;
        for (int i = 0; i < S_NEW; i++)
            same += tok[i] == s_fx.ref_tok[i];
        printf("  %s (fp16 source) via proxy: max |logit err| %.3g (bound %.1e); greedy tokens "
               "equal to the full recompute %d/%d; %llu block bytes (%.2f of fp16)\n",
               kvedge_scheme_name(schemes[si]), d, tols[si], same, S_NEW,
               (unsigned long long)st.bytes, (double)st.bytes / (double)st.fp16_bytes);
        errs[si] = d;
        assert_true(d <= tols[si]);
        assert_true(d > 0); /* lossy: the fetched K/V was used, not a recompute */
        if (schemes[si] == KVEDGE_SCHEME_INT8)
            assert_int_equal(tok[0], s_fx.ref_tok[0]);
        kvedge_client_destroy(&pc);
        kvedge_proxy_destroy(&p);
        s_node_stop(&cloud);
    }
    assert_true(errs[0] < errs[1]);
    free(r);
    free(got);
    s_env_stop(&e);
}

/* The cache optimizer end to end: the context stored lossless fp32, a decode that accepts
 * only int8 gets every layer at int8 (the node derives it), its logits within int8's bound
 * and not bit-identical (the int8 K/V was used); the plan and both printouts say the
 * precision of each layer. A decode without an accept list gets the lossless blocks. */
static void test_precision_accept(void **state)
{
    (void)state;
    s_env_t e;
    s_env_start(&e);
    s_node_t cloud;
    kvedge_e2e_prefill_stats_t st;
    s_lossless_cloud(&e, &cloud, "cloudp", &st);
    char spec[400], pep[300];
    snprintf(spec, sizeof spec, "cloud cloudp %s", cloud.ep);
    const char *specs[] = {spec};
    kvedge_proxy_t *p = s_proxy(&e, "proxy-prec", specs, 1, 1, pep, sizeof pep);
    kvedge_client_t *pc = s_client(pep, S_DEADLINE);
    float *got = s_logits();
    kvedge_e2e_result_t *r = s_result();
    int32_t tok[S_NEW];
    const kvedge_prec_t int8 = KVEDGE_PREC_MAKE(KVEDGE_PREC_INT8, 0);
    kvedge_e2e_request_t rq = {.mode = KVEDGE_E2E_KVEDGE,
                               .decoder = s_fx.dec,
                               .ctx = s_fx.ctx,
                               .ctx_len = S_CTX,
                               .prompt = s_fx.prompt,
                               .prompt_len = S_PROMPT,
                               .max_new = S_NEW,
                               .proxy = pc,
                               .model = &s_fx.model,
                               .chunk_tokens = S_CHUNK,
                               .deadline_ms = S_DEADLINE,
                               .logits = got,
                               .accept = &int8,
                               .n_accept = 1};
    assert_int_equal(kvedge_e2e_decode(&rq, tok, r), KVEDGE_OK);
    s_check_layers(r, 0);
    assert_true(r->have_plan);
    for (uint32_t l = 0; l < r->layers; l++) {
        assert_int_equal(r->plan.layer[l].prec, int8);
        assert_int_equal(r->plan.layer[l].prec_reason, KVEDGE_PLAN_PREC_ONLY);
    }
    float d = s_max_diff(got, s_fx.ref, s_fx.c->vocab);
    assert_true(d > 0 && d <= S_TOL_INT8);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    kvedge_e2e_print(f, r, true);
    fclose(f);
    assert_non_null(strstr(buf, "\"prec\":\"int8\",\"prec_reason\":\"only\""));
    cJSON *js = cJSON_Parse(buf);
    assert_non_null(js);
    cJSON_Delete(js);
    free(buf);
    f = open_memstream(&buf, &len);
    assert_non_null(f);
    kvedge_e2e_print(f, r, false);
    fclose(f);
    assert_non_null(strstr(buf, "precision"));
    assert_non_null(strstr(buf, "int8"));
    free(buf);
    /* No accept list: the blocks as stored (lossless fp32), bit-identical logits, no rung. */
    rq.accept = NULL;
    rq.n_accept = 0;
    assert_int_equal(kvedge_e2e_decode(&rq, tok, r), KVEDGE_OK);
    assert_int_equal(s_max_diff(got, s_fx.ref, s_fx.c->vocab), 0);
    for (uint32_t l = 0; l < r->layers; l++)
        assert_int_equal(r->plan.layer[l].prec, 0);
    /* A budget without an accept list is refused before anything is sent. */
    rq.quality_metric = KVEDGE_QUALITY_KL;
    rq.quality_budget = 1e-4;
    assert_int_equal(kvedge_e2e_decode(&rq, tok, r), KVEDGE_EINVAL);
    free(r);
    free(got);
    kvedge_client_destroy(&pc);
    kvedge_proxy_destroy(&p);
    s_node_stop(&cloud);
    s_env_stop(&e);
}

/* ---------------------------------------------------------------- 3. sources */

/* One proxy over the given sources, one decode: the per-layer sources (expected_src[l], NULL:
 * not checked), the tokens, and the logits. */
static void s_decode_via(const s_env_t *e, const char *pname, const char *const *specs, size_t n,
                         const char *const *expected_src, float *logits, kvedge_e2e_result_t *r)
{
    char pep[300];
    kvedge_proxy_t *p = s_proxy(e, pname, specs, n, n, pep, sizeof pep);
    kvedge_client_t *pc = s_client(pep, S_DEADLINE);
    int32_t tok[S_NEW];
    int rc = s_e2e(KVEDGE_E2E_KVEDGE, pc, false, S_DEADLINE, NULL, tok, logits, r);
    if (rc != KVEDGE_OK)
        fail_msg("decode via %s: %s", pname, kvedge_strerror(rc));
    s_check_layers(r, 0);
    for (uint32_t l = 0; l < r->layers; l++)
        if (expected_src && expected_src[l])
            assert_string_equal(r->layer[l].source, expected_src[l]);
    assert_memory_equal(tok, s_fx.ref_tok, sizeof tok);
    kvedge_client_destroy(&pc);
    kvedge_proxy_destroy(&p);
}

/* The same context (lossless fp32) on a cloud node, a peer edge and a historical cache, each
 * the only source of its proxy, and a mixed plan (the peer holding only the shallow layers,
 * as the master's directory says; the cloud all): bit-identical logits every time. The peers'
 * blocks are encoded by the test, the others by kvedge_e2e_prefill. */
static void test_sources_identical(void **state)
{
    (void)state;
    const uint32_t V = s_fx.c->vocab, L = s_fx.c->layers;
    s_env_t e;
    s_env_start(&e);
    s_node_t cloud, peer, hist;
    s_node_start(&cloud, &e, "cloud1", KVEDGE_ROLE_CLOUD, false);
    s_node_start(&peer, &e, "edgeA", KVEDGE_ROLE_EDGE, false);
    s_node_start(&hist, &e, "hist", KVEDGE_ROLE_EDGE, false);
    kvedge_e2e_quant_t q;
    s_quant(&q, KVEDGE_SCHEME_LOSSLESS, KVEDGE_DTYPE_FP32, false);
    s_prefill(cloud.ep, &q, NULL);
    s_put_layers(peer.ep, 0, L);
    s_quant(&q, KVEDGE_SCHEME_LOSSLESS, KVEDGE_DTYPE_FP32, true); /* the pinned historical copy */
    s_prefill(hist.ep, &q, NULL);

    float *lg[4];
    for (int i = 0; i < 4; i++)
        lg[i] = s_logits();
    kvedge_e2e_result_t *r = s_result();
    char spec[3][400];
    snprintf(spec[0], sizeof spec[0], "cloud cloud1 %s", cloud.ep);
    snprintf(spec[1], sizeof spec[1], "peer edgeA %s", peer.ep);
    snprintf(spec[2], sizeof spec[2], "history hist %s", hist.ep);
    const char *names[] = {"cloud1", "edgeA", "hist"};
    const int kinds[] = {KVEDGE_PLAN_CLOUD, KVEDGE_PLAN_PEER, KVEDGE_PLAN_HISTORY};
    for (int i = 0; i < 3; i++) {
        const char *specs[] = {spec[i]};
        const char *want[S_MAXL];
        for (uint32_t l = 0; l < L; l++)
            want[l] = names[i];
        char pname[32];
        snprintf(pname, sizeof pname, "proxy-%s", names[i]);
        s_decode_via(&e, pname, specs, 1, want, lg[i], r);
        for (uint32_t l = 0; l < L; l++)
            assert_int_equal(r->layer[l].kind, kinds[i]);
    }
    assert_memory_equal(lg[0], lg[1], V * sizeof(float));
    assert_memory_equal(lg[0], lg[2], V * sizeof(float));

    /* Mixed: a second peer holds the shallow layers and says so through the master; the
     * cloud (slower link) holds them all. */
    const uint32_t shallow = (L + 1) / 2;
    s_node_t peer2;
    s_node_start(&peer2, &e, "edgeS", KVEDGE_ROLE_EDGE, true);
    s_put_layers(peer2.ep, 0, shallow);
    uint32_t changed;
    assert_int_equal(kvedge_node_publish(peer2.node, &changed), KVEDGE_OK);
    char mspec[2][400];
    snprintf(mspec[0], sizeof mspec[0], "cloud cloud1 %s link=100mbit,5ms bw=12500000 rtt=10000",
             cloud.ep);
    snprintf(mspec[1], sizeof mspec[1], "peer edgeS %s bw=1000000000 rtt=200", peer2.ep);
    const char *mspecs[] = {mspec[0], mspec[1]};
    const char *want[S_MAXL] = {NULL};
    for (uint32_t l = shallow; l < L; l++)
        want[l] = "cloud1"; /* the directory says the peer lacks them */
    s_decode_via(&e, "proxy-mixed", mspecs, 2, want, lg[3], r);
    uint32_t from_peer = 0;
    for (uint32_t l = 0; l < L; l++) {
        from_peer += strcmp(r->layer[l].source, "edgeS") == 0;
        if (l >= shallow)
            assert_int_equal(r->layer[l].reason, KVEDGE_FETCH_PLANNED);
    }
    assert_true(from_peer >= 1);
    assert_memory_equal(lg[0], lg[3], V * sizeof(float));
    printf("  cloud, peer, history and mixed (%u of %u layers from the peer): logits "
           "bit-identical; max |diff| vs full recompute %.3g\n",
           from_peer, L, s_max_diff(lg[0], s_fx.ref, V));

    free(r);
    for (int i = 0; i < 4; i++)
        free(lg[i]);
    s_node_stop(&peer2);
    s_node_stop(&hist);
    s_node_stop(&peer);
    s_node_stop(&cloud);
    s_env_stop(&e);
}

/* Issue 16, work placed where it costs least: over a slow link the decoder is ahead of the
 * fetch, so it computes a fetched layer whose successor has not arrived on fewer BLAS threads
 * (kvedge_decoder_share_cores), not feeding that layer's time back as its speed; the last
 * layer runs on all of them, the process's count is restored after the decode, and the logits
 * are those of a full recompute. Which layers are yielded depends on when the next one lands
 * (the proxy may deliver two layers within a millisecond), so the test checks the rule where
 * the timeline decides it: a layer after which the decoder waited long for the next one was
 * computed while that one was still on its way, so it must have been yielded; over this link
 * at least one such layer exists. */
#define S_WAITED_US 20000.0 /* far above a wake-up's latency, far below a layer on the link */

static void test_yields_cores_to_a_slow_fetch(void **state)
{
    (void)state;
    const uint32_t V = s_fx.c->vocab, L = s_fx.c->layers;
    const int before = openblas_get_num_threads();
    openblas_set_num_threads(4);
    const int fewer = 4 - KVEDGE_DECODER_FETCH_THREADS;
    s_env_t e;
    s_env_start(&e);
    s_node_t cloud;
    kvedge_e2e_prefill_stats_t st;
    s_lossless_cloud(&e, &cloud, "cloud1", &st);
    /* Each layer takes 8 * st.bytes / L / 2e6 s on the link (tens of ms); the decoder computes
     * a layer of this model in well under a millisecond. */
    char spec[400];
    snprintf(spec, sizeof spec, "cloud cloud1 %s link=2mbit,1ms bw=250000 rtt=2000", cloud.ep);
    const char *specs[] = {spec};
    float *lg = s_logits();
    kvedge_e2e_result_t *r = s_result();
    kvedge_decoder_forget(s_fx.dec);
    s_decode_via(&e, "proxy-slow", specs, 1, NULL, lg, r);
    uint32_t waited = 0;
    for (uint32_t l = 0; l < L; l++) {
        const kvedge_e2e_layer_t *x = &r->layer[l];
        printf("  layer %u: ready %.1f ms, done %.1f ms, %d BLAS threads%s\n", l, x->ready_us / 1e3,
               x->done_us / 1e3, x->blas_threads, x->yielded ? " (yielded to the fetch)" : "");
        assert_int_equal(x->blas_threads, x->yielded ? fewer : 4);
        if (l + 1 == L) {
            assert_false(x->yielded); /* nothing left to fetch */
        } else if (r->layer[l + 1].ready_us - x->done_us > S_WAITED_US) {
            assert_true(x->yielded); /* the next layer landed well after this one was done */
            waited++;
        }
    }
    assert_true(waited >= 1);
    assert_int_equal(openblas_get_num_threads(), 4);
    kvedge_decoder_speed_t sp;
    assert_int_equal(kvedge_decoder_speed(s_fx.dec, &sp), KVEDGE_OK);
    assert_int_equal(sp.compute_samples, s_compute_samples(r)); /* none of the yielded ones */
    assert_true(s_max_diff(lg, s_fx.ref, V) <= S_TOL_LOSSLESS);
    free(r);
    free(lg);
    s_node_stop(&cloud);
    s_env_stop(&e);
    openblas_set_num_threads(before);
}

/* K/V computed elsewhere (kvedge_e2e_prefill_kv: a GPU cloud hands its own) puts the same
 * blocks as the cloud prefill that computes it: same counts and bytes, and a decode through
 * either node gives bit-identical logits. NULL K/V is refused. */
static void test_prefill_kv_same_blocks(void **state)
{
    (void)state;
    const uint32_t V = s_fx.c->vocab, L = s_fx.c->layers;
    s_env_t e;
    s_env_start(&e);
    s_node_t a, b;
    s_node_start(&a, &e, "cloudA", KVEDGE_ROLE_CLOUD, false);
    s_node_start(&b, &e, "cloudB", KVEDGE_ROLE_CLOUD, false);
    kvedge_e2e_quant_t q;
    s_quant(&q, KVEDGE_SCHEME_INT8, KVEDGE_DTYPE_FP16, false);
    kvedge_e2e_prefill_stats_t sa, sb;
    s_prefill(a.ep, &q, &sa);
    kvedge_client_t *c = s_client(b.ep, S_DEADLINE);
    kvedge_chunk_id_t ids[S_NCHUNK + 1];
    assert_int_equal(kvedge_e2e_prefill_kv(c, s_fx.dec, &s_fx.model, s_fx.ctx, S_CTX, S_CHUNK, &q,
                                           NULL, s_fx.cv, ids, S_NCHUNK + 1, &sb),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_prefill_kv(c, s_fx.dec, &s_fx.model, s_fx.ctx, S_CTX, S_CHUNK, &q,
                                           s_fx.ck, s_fx.cv, ids, S_NCHUNK + 1, &sb),
                     KVEDGE_OK);
    kvedge_client_destroy(&c);
    assert_memory_equal(ids, s_fx.ids, sizeof s_fx.ids);
    assert_int_equal(sb.blocks, sa.blocks);
    assert_int_equal(sb.bytes, sa.bytes);
    assert_true(sb.prefill_us == 0 && sa.prefill_us > 0); /* nothing was computed */

    float *la = s_logits(), *lb = s_logits();
    kvedge_e2e_result_t *r = s_result();
    char spec[2][400];
    snprintf(spec[0], sizeof spec[0], "cloud cloudA %s", a.ep);
    snprintf(spec[1], sizeof spec[1], "cloud cloudB %s", b.ep);
    const char *want_a[S_MAXL], *want_b[S_MAXL];
    for (uint32_t l = 0; l < L; l++) {
        want_a[l] = "cloudA";
        want_b[l] = "cloudB";
    }
    const char *specs_a[] = {spec[0]}, *specs_b[] = {spec[1]};
    s_decode_via(&e, "proxy-a", specs_a, 1, want_a, la, r);
    s_decode_via(&e, "proxy-b", specs_b, 1, want_b, lb, r);
    assert_memory_equal(la, lb, V * sizeof(float));
    free(r);
    free(la);
    free(lb);
    s_node_stop(&b);
    s_node_stop(&a);
    s_env_stop(&e);
}

/* ---------------------------------------------------------------- 4. misses */

/* The source holds only the shallow layers: the rest come back as misses and are computed
 * (same logits within fp32 rounding, same tokens). Then the source is killed: every layer is
 * computed, within the deadline, same result. */
static void test_miss_recomputed(void **state)
{
    (void)state;
    const uint32_t V = s_fx.c->vocab, L = s_fx.c->layers, shallow = L / 2 + 1; /* 0 .. L/2 */
    assert_true(shallow < L);
    s_env_t e;
    s_env_start(&e);
    float *got = s_logits();
    kvedge_e2e_result_t *r = s_result();
    int32_t tok[S_NEW];

    s_node_t part;
    s_node_start(&part, &e, "cloud1", KVEDGE_ROLE_CLOUD, false);
    s_put_layers(part.ep, 0, shallow);
    char spec[400], pep[300];
    snprintf(spec, sizeof spec, "cloud cloud1 %s", part.ep);
    const char *specs[] = {spec};
    kvedge_proxy_t *p = s_proxy(&e, "proxy-part", specs, 1, 1, pep, sizeof pep);
    kvedge_client_t *pc = s_client(pep, S_DEADLINE);
    int rc = s_e2e(KVEDGE_E2E_KVEDGE, pc, false, S_DEADLINE, NULL, tok, got, r);
    if (rc != KVEDGE_OK)
        fail_msg("decode: %s", kvedge_strerror(rc));
    s_check_layers(r, ((1u << L) - 1) & ~((1u << shallow) - 1));
    assert_int_equal(r->computed, L - shallow);
    for (uint32_t l = 0; l < shallow; l++)
        assert_string_equal(r->layer[l].source, "cloud1");
    assert_memory_equal(tok, s_fx.ref_tok, sizeof tok);
    float dpart = s_max_diff(got, s_fx.ref, V);
    assert_true(dpart <= S_TOL_LOSSLESS);
    kvedge_client_destroy(&pc);
    kvedge_proxy_destroy(&p);
    s_node_stop(&part);

    /* The only source dies (SIGKILL) after the proxy has connected to it. */
    char cep[300];
    snprintf(cep, sizeof cep, "ipc://%s/cloud-proc.sock", e.root);
    pid_t pid = s_spawn_cloud(&e, cep);
    kvedge_e2e_quant_t q;
    s_quant(&q, KVEDGE_SCHEME_LOSSLESS, KVEDGE_DTYPE_FP32, false);
    s_prefill(cep, &q, NULL);
    snprintf(spec, sizeof spec, "cloud cloud9 %s", cep);
    p = s_proxy(&e, "proxy-down", specs, 1, 1, pep, sizeof pep);
    pc = s_client(pep, S_DEADLINE);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    int64_t t0 = zclock_mono();
    rc = s_e2e(KVEDGE_E2E_KVEDGE, pc, false, S_DOWN_DEADLINE, NULL, tok, got, r);
    int64_t ms = zclock_mono() - t0;
    if (rc != KVEDGE_OK)
        fail_msg("decode with the source down: %s", kvedge_strerror(rc));
    s_check_layers(r, (1u << L) - 1);
    assert_int_equal(r->fetched, 0);
    assert_memory_equal(tok, s_fx.ref_tok, sizeof tok);
    assert_true(ms < S_DOWN_DEADLINE + KT_SLACK_MS);
    float ddown = s_max_diff(got, s_fx.ref, V);
    assert_true(ddown <= S_TOL_LOSSLESS);
    printf("  %u of %u layers missing: max |logit diff| %.3g; source down: all %u computed in "
           "%lld ms (deadline %d), max |logit diff| %.3g (tol %.0e)\n",
           L - shallow, L, dpart, L, (long long)ms, S_DOWN_DEADLINE, ddown, S_TOL_LOSSLESS);
    kvedge_client_destroy(&pc);
    kvedge_proxy_destroy(&p);

    free(r);
    free(got);
    s_env_stop(&e);
}

/* ---------------------------------------------------------------- 4b. in place */

/* The copying path kvedge_e2e_decode used before the session lent its storage: the pipeline
 * dequantizes into buffers of its own and the provider copies each resident layer into the
 * session (MISS for the rest). */
typedef struct {
    kvedge_pipeline_t *pipe;
    const float *k, *v;
    uint32_t missed; /* layers reported as a miss */
} s_copying_t;

static int s_copying_provide(void *arg, uint32_t layer, float *k, float *v)
{
    s_copying_t *p = arg;
    int rc = kvedge_pipeline_wait(p->pipe, (uint16_t)layer);
    if (rc == KVEDGE_ENOTFOUND) {
        p->missed |= 1u << layer;
        return KVEDGE_DECODER_MISS;
    }
    if (rc != KVEDGE_OK)
        return rc;
    memcpy(k, p->k + layer * s_fx.kvf, s_fx.kvf * sizeof(float));
    memcpy(v, p->v + layer * s_fx.kvf, s_fx.kvf * sizeof(float));
    return 0;
}

/* The fixture's decode through pc by the copying path: the prompt's last logits, S_NEW tokens;
 * returns the mask of the layers it computed. */
static uint32_t s_decode_copying(kvedge_client_t *pc, float *logits, int32_t *tokens)
{
    const uint32_t L = s_fx.c->layers;
    float *dk = malloc(L * s_fx.kvf * sizeof(float)), *dv = malloc(L * s_fx.kvf * sizeof(float));
    assert_true(dk && dv);
    kvedge_kv_dst_t kd[S_MAXL], vd[S_MAXL];
    for (uint32_t l = 0; l < L; l++) {
        kvedge_kv_dst_t t = {.layout = KVEDGE_KV_CONTIG,
                             .dtype = KVEDGE_DTYPE_FP32,
                             .base = dk + l * s_fx.kvf,
                             .cap_bytes = s_fx.kvf * sizeof(float),
                             .heads = s_fx.c->heads,
                             .head_dim = s_fx.c->head_dim,
                             .tokens_cap = S_CTX};
        kd[l] = t;
        t.base = dv + l * s_fx.kvf;
        vd[l] = t;
    }
    kvedge_pipeline_opts_t o = {
        .size = sizeof(kvedge_pipeline_opts_t),
        .client = pc,
        .model = &s_fx.model,
        .chunks = s_fx.ids,
        .n_chunks = S_NCHUNK,
        .chunk_tokens = S_CHUNK,
        .tokens = S_CTX,
        .layers = (uint16_t)L,
        .k = kd,
        .v = vd,
        .slot_bytes = kvedge_e2e_slot_bytes(S_CTX, S_CHUNK, s_fx.c->heads, s_fx.c->head_dim),
        .deadline_ms = S_DEADLINE,
    };
    s_copying_t p = {.k = dk, .v = dv};
    assert_int_equal(kvedge_pipeline_open(&o, &p.pipe), KVEDGE_OK);
    assert_int_equal(
        s_session(s_copying_provide, &p, s_fx.ctx, S_CTX, s_fx.prompt, S_PROMPT, logits, tokens),
        KVEDGE_OK);
    kvedge_pipeline_destroy(&p.pipe);
    free(dv);
    free(dk);
    return p.missed;
}

/* kvedge mode dequantizes straight into the decoder session's K/V: the same logits and tokens
 * as the copying path to the bit, lossless fp32, int8 and int4, with misses at the first and
 * last layers and at the middle one, through the default ring (KVEDGE_E2E_RING_DEFAULT slots,
 * fewer than the layers: slots are reused); and the fetched K/V costs nothing beyond the
 * ring: kvedge's K/V bytes are edge-only's plus the ring (plus the rerun scratch its misses
 * after fetched layers take). */
static void test_in_place_matches_copying(void **state)
{
    (void)state;
    const uint32_t V = s_fx.c->vocab, L = s_fx.c->layers;
    assert_int_equal(L, 3);
    float *got = s_logits(), *ref = s_logits();
    kvedge_e2e_result_t *r = s_result();
    int32_t tok[S_NEW], ref_tok[S_NEW];

    assert_int_equal(s_e2e(KVEDGE_E2E_LOCAL, NULL, false, 0, NULL, tok, got, r), KVEDGE_OK);
    const uint64_t local_bytes = r->kv_bytes;
    const uint64_t sess = 2ull * L * sizeof(float) *
                          (s_fx.kvf + kvedge_decoder_kv_floats(s_fx.dec, S_PROMPT + S_NEW));
    const uint64_t hid = (uint64_t)S_CTX * s_fx.c->hidden * sizeof(float);
    assert_int_equal(local_bytes, sess + hid);
    const uint64_t tmp = 2ull * s_fx.kvf * sizeof(float);
    const uint64_t ring = (uint64_t)(L < KVEDGE_E2E_RING_DEFAULT ? L : KVEDGE_E2E_RING_DEFAULT) *
                          kvedge_e2e_slot_bytes(S_CTX, S_CHUNK, s_fx.c->heads, s_fx.c->head_dim);
    /* The default ring is smaller than the fixture's layers: a slot is reused mid-fetch. */
    assert_true(KVEDGE_E2E_RING_DEFAULT < L);

    /* Lossless fp32 (the largest a slot must hold), int8 and int4 through the default ring. */
    const kvedge_scheme_t schemes[] = {KVEDGE_SCHEME_LOSSLESS, KVEDGE_SCHEME_INT8,
                                       KVEDGE_SCHEME_INT4};
    /* Stored layers [l0, l1) ∪ [l2, l3): misses at 0 and 2 (layer 1 stored), then at 1. */
    const uint32_t held[2][4] = {{1, 2, 2, 2}, {0, 1, 2, 3}};
    const uint32_t missed[2] = {0x5, 0x2};
    int n = 0;
    for (int si = 0; si < 3; si++)
        for (int hi = 0; hi < 2; hi++) {
            char name[32], pname[32], spec[400], pep[300];
            snprintf(name, sizeof name, "inplace%d", n);
            snprintf(pname, sizeof pname, "proxy-inplace%d", n++);
            /* A world of its own: no other case's copy of these chunks in its directory. */
            s_env_t e;
            s_env_start(&e);
            s_node_t node;
            s_node_start(&node, &e, name, KVEDGE_ROLE_CLOUD, false);
            s_put_layers_as(node.ep, held[hi][0], held[hi][1], schemes[si]);
            if (held[hi][2] < held[hi][3])
                s_put_layers_as(node.ep, held[hi][2], held[hi][3], schemes[si]);
            snprintf(spec, sizeof spec, "cloud %s %s", name, node.ep);
            const char *specs[] = {spec};
            kvedge_proxy_t *p = s_proxy(&e, pname, specs, 1, 1, pep, sizeof pep);
            kvedge_client_t *pc = s_client(pep, S_DEADLINE);

            int rc = s_e2e(KVEDGE_E2E_KVEDGE, pc, false, S_DEADLINE, NULL, tok, got, r);
            if (rc != KVEDGE_OK)
                fail_msg("decode %s: %s", kvedge_scheme_name(schemes[si]), kvedge_strerror(rc));
            s_check_layers(r, missed[hi]);
            /* A proxy plans its later requests with what it learned of the link (it may then
             * price a layer as recompute): the copying path gets a fresh proxy of its own. */
            char pep2[300];
            snprintf(pname, sizeof pname, "proxy-copying%d", n);
            kvedge_proxy_t *p2 = s_proxy(&e, pname, specs, 1, 1, pep2, sizeof pep2);
            kvedge_client_t *pc2 = s_client(pep2, S_DEADLINE);
            assert_int_equal(s_decode_copying(pc2, ref, ref_tok), missed[hi]);
            kvedge_client_destroy(&pc2);
            kvedge_proxy_destroy(&p2);
            assert_memory_equal(got, ref, V * sizeof(float));
            assert_memory_equal(tok, ref_tok, sizeof tok);
            /* Both have a computed layer after a fetched one: the rerun scratch. */
            assert_int_equal(r->kv_bytes, local_bytes + tmp + ring);
            float d = s_max_diff(got, s_fx.ref, V);
            if (schemes[si] != KVEDGE_SCHEME_LOSSLESS)
                assert_true(d > 0); /* the fetched (lossy) K/V was used */
            else
                assert_true(d <= S_TOL_LOSSLESS);
            printf("  in place, %s, computed layers mask 0x%x: bit-identical to the copying "
                   "path (|logit diff| vs recompute %.3g); K/V %llu bytes = edge-only %llu + "
                   "ring %llu + scratch %llu\n",
                   kvedge_scheme_name(schemes[si]), missed[hi], d, (unsigned long long)r->kv_bytes,
                   (unsigned long long)local_bytes, (unsigned long long)ring,
                   (unsigned long long)tmp);
            kvedge_client_destroy(&pc);
            kvedge_proxy_destroy(&p);
            s_node_stop(&node);
            s_env_stop(&e);
        }
    free(r);
    free(ref);
    free(got);
}

/* ---------------------------------------------------------------- 5. privacy */

/* A spy between a client and a server: a ROUTER where the client connects and one DEALER per
 * client toward the real endpoint, so the kvedge framing (header first, no envelope) passes
 * unchanged both ways. Keeps a copy of every frame sent toward the server (bounded) and
 * counts messages each way and requests by opcode. */
#define S_SPY_PEERS         16
#define S_SPY_POLL_MS       20
#define S_SPY_CAPTURE_BYTES (64u << 20)

typedef struct {
    uint8_t *data;
    size_t len;
} s_frame_t;

typedef struct {
    char ep[300], target[300];
    zsock_t *front;
    struct {
        uint8_t id[256];
        size_t id_len;
        zsock_t *back;
    } peer[S_SPY_PEERS];
    size_t npeers;
    pthread_t thread;
    atomic_bool stop;
    pthread_mutex_t mu; /* guards what follows */
    s_frame_t *up;
    size_t nup, up_cap, up_bytes;
    bool overflow;
    uint64_t up_msgs, down_msgs;
    uint64_t ops[KVEDGE_OP_FETCH + 1];
} s_spy_t;

static void s_spy_record(s_spy_t *s, zmsg_t *m)
{
    pthread_mutex_lock(&s->mu);
    s->up_msgs++;
    zframe_t *f = zmsg_first(m);
    kvedge_wire_header_t h;
    if (f && kvedge_wire_header_parse(zframe_data(f), zframe_size(f), &h) == KVEDGE_OK &&
        h.opcode <= KVEDGE_OP_FETCH)
        s->ops[h.opcode]++;
    for (; f; f = zmsg_next(m)) {
        size_t len = zframe_size(f);
        if (s->up_bytes + len > S_SPY_CAPTURE_BYTES) {
            s->overflow = true;
            break;
        }
        if (s->nup == s->up_cap) {
            size_t cap = s->up_cap ? 2 * s->up_cap : 256;
            s_frame_t *grown = realloc(s->up, cap * sizeof *grown);
            if (!grown) {
                s->overflow = true;
                break;
            }
            s->up = grown;
            s->up_cap = cap;
        }
        uint8_t *copy = malloc(len ? len : 1);
        if (!copy) {
            s->overflow = true;
            break;
        }
        memcpy(copy, zframe_data(f), len);
        s->up[s->nup++] = (s_frame_t){copy, len};
        s->up_bytes += len;
    }
    pthread_mutex_unlock(&s->mu);
}

/* A message from a client: strip its routing id, forward on that client's own DEALER. */
static void s_spy_upstream(s_spy_t *s)
{
    zmsg_t *m = zmsg_recv(s->front);
    if (!m)
        return;
    zframe_t *id = zmsg_pop(m);
    size_t i = 0;
    while (i < s->npeers && !(zframe_size(id) == s->peer[i].id_len &&
                              memcmp(zframe_data(id), s->peer[i].id, s->peer[i].id_len) == 0))
        i++;
    if (i == s->npeers && s->npeers < S_SPY_PEERS && zframe_size(id) <= sizeof s->peer[i].id) {
        zsock_t *b = zsock_new(ZMQ_DEALER);
        if (b) {
            zsock_set_linger(b, 0);
            zsock_set_sndhwm(b, 0);
            zsock_set_rcvhwm(b, 0);
            if (zsock_connect(b, "%s", s->target) == 0) {
                memcpy(s->peer[i].id, zframe_data(id), zframe_size(id));
                s->peer[i].id_len = zframe_size(id);
                s->peer[i].back = b;
                s->npeers++;
            } else {
                zsock_destroy(&b);
            }
        }
    }
    zframe_destroy(&id);
    if (i == s->npeers) { /* no room: dropped, and the test fails on it */
        pthread_mutex_lock(&s->mu);
        s->overflow = true;
        pthread_mutex_unlock(&s->mu);
        zmsg_destroy(&m);
        return;
    }
    s_spy_record(s, m);
    zmsg_send(&m, s->peer[i].back);
}

/* A message from the server to client i: put its routing id back. */
static void s_spy_downstream(s_spy_t *s, size_t i)
{
    zmsg_t *m = zmsg_recv(s->peer[i].back);
    if (!m)
        return;
    pthread_mutex_lock(&s->mu);
    s->down_msgs++;
    pthread_mutex_unlock(&s->mu);
    zmsg_pushmem(m, s->peer[i].id, s->peer[i].id_len);
    zmsg_send(&m, s->front);
}

static void *s_spy_run(void *arg)
{
    s_spy_t *s = arg;
    while (!atomic_load(&s->stop)) {
        zmq_pollitem_t items[1 + S_SPY_PEERS];
        size_t n = s->npeers;
        items[0] = (zmq_pollitem_t){zsock_resolve(s->front), 0, ZMQ_POLLIN, 0};
        for (size_t i = 0; i < n; i++)
            items[1 + i] = (zmq_pollitem_t){zsock_resolve(s->peer[i].back), 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(items, (int)(1 + n), S_SPY_POLL_MS);
        if (rc < 0 && errno != EINTR)
            break;
        if (rc <= 0)
            continue;
        if (items[0].revents & ZMQ_POLLIN)
            s_spy_upstream(s);
        for (size_t i = 0; i < n; i++)
            if (items[1 + i].revents & ZMQ_POLLIN)
                s_spy_downstream(s, i);
    }
    return NULL;
}

static void s_spy_start(s_spy_t *s, const char *ep, const char *target)
{
    memset(s, 0, sizeof *s);
    snprintf(s->ep, sizeof s->ep, "%s", ep);
    snprintf(s->target, sizeof s->target, "%s", target);
    pthread_mutex_init(&s->mu, NULL);
    atomic_init(&s->stop, false);
    s->front = zsock_new(ZMQ_ROUTER);
    assert_non_null(s->front);
    zsock_set_linger(s->front, 0);
    zsock_set_sndhwm(s->front, 0);
    zsock_set_rcvhwm(s->front, 0);
    assert_int_not_equal(zsock_bind(s->front, "%s", ep), -1);
    assert_int_equal(pthread_create(&s->thread, NULL, s_spy_run, s), 0);
}

static void s_spy_stop(s_spy_t *s)
{
    atomic_store(&s->stop, true);
    pthread_join(s->thread, NULL);
    for (size_t i = 0; i < s->npeers; i++)
        zsock_destroy(&s->peer[i].back);
    zsock_destroy(&s->front);
    for (size_t i = 0; i < s->nup; i++)
        free(s->up[i].data);
    free(s->up);
    pthread_mutex_destroy(&s->mu);
}

/* What a spy saw so far. */
typedef struct {
    uint64_t up_msgs, down_msgs;
    uint64_t ops[KVEDGE_OP_FETCH + 1];
    size_t frames, bytes;
    bool overflow;
} s_spy_counts_t;

static void s_spy_counts(s_spy_t *s, s_spy_counts_t *out)
{
    pthread_mutex_lock(&s->mu);
    out->up_msgs = s->up_msgs;
    out->down_msgs = s->down_msgs;
    memcpy(out->ops, s->ops, sizeof out->ops);
    out->frames = s->nup;
    out->bytes = s->up_bytes;
    out->overflow = s->overflow;
    pthread_mutex_unlock(&s->mu);
}

/* Captured upstream frames that contain pat. */
static size_t s_spy_contains(s_spy_t *s, const uint8_t *pat, size_t len)
{
    size_t hits = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nup; i++)
        hits += memmem(s->up[i].data, s->up[i].len, pat, len) != NULL;
    pthread_mutex_unlock(&s->mu);
    return hits;
}

/* Captured upstream frames that contain any S_LEAK_WINDOW-element window of seq (n elements
 * of size bytes each). */
static size_t s_spy_find(s_spy_t *s, const uint8_t *seq, size_t n, size_t size)
{
    size_t hits = 0, win = S_LEAK_WINDOW * size;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nup; i++) {
        bool hit = false;
        for (size_t w = 0; !hit && w + S_LEAK_WINDOW <= n; w++)
            hit = memmem(s->up[i].data, s->up[i].len, seq + w * size, win) != NULL;
        hits += hit;
    }
    pthread_mutex_unlock(&s->mu);
    return hits;
}

/* The prompt's three wire forms: int32 LE ids, uint16 LE ids, text bytes. */
typedef struct {
    uint8_t i32[S_PROMPT * 4], u16[S_PROMPT * 2];
} s_forms_t;

static void s_forms(s_forms_t *f)
{
    for (uint32_t i = 0; i < S_PROMPT; i++) {
        kvedge_le_put32(f->i32 + 4 * i, (uint32_t)s_fx.prompt[i]);
        f->u16[2 * i] = (uint8_t)s_fx.prompt[i];
        f->u16[2 * i + 1] = (uint8_t)((uint32_t)s_fx.prompt[i] >> 8);
    }
}

/* Frames leaking each form: hits[0] int32, hits[1] uint16, hits[2] text. */
static void s_leaks(s_spy_t *s, const s_forms_t *f, size_t hits[3])
{
    hits[0] = s_spy_find(s, f->i32, S_PROMPT, 4);
    hits[1] = s_spy_find(s, f->u16, S_PROMPT, 2);
    hits[2] = s_spy_find(s, (const uint8_t *)s_prompt_text, S_PROMPT, 1);
}

/* Positive control: a PUT whose lossless fp32 block carries the prompt in all three forms
 * (as K's raw bytes: small ids and ASCII are finite floats), sent through the spy. Returns
 * the put's status. */
static int s_put_prompt_bytes(const char *ep)
{
    const uint32_t D = s_fx.c->head_dim;
    s_forms_t f;
    s_forms(&f);
    float *k = calloc((size_t)S_CHUNK * D, sizeof(float)),
          *v = calloc((size_t)S_CHUNK * D, sizeof(float));
    assert_true(k && v);
    uint8_t *kb = (uint8_t *)k;
    assert_true(sizeof f.i32 + sizeof f.u16 + S_PROMPT <= (size_t)S_CHUNK * D * sizeof(float));
    memcpy(kb, f.i32, sizeof f.i32);
    memcpy(kb + sizeof f.i32, f.u16, sizeof f.u16);
    memcpy(kb + sizeof f.i32 + sizeof f.u16, s_prompt_text, S_PROMPT);
    kvedge_block_spec_t spec = {
        KVEDGE_DTYPE_FP32, KVEDGE_SCHEME_LOSSLESS, S_CHUNK, (uint16_t)D, 0, NULL, false};
    size_t cap = kvedge_block_encoded_bound(&spec), len;
    uint8_t *blk = malloc(cap);
    assert_non_null(blk);
    assert_int_equal(kvedge_block_encode(&spec, k, v, blk, cap, &len), KVEDGE_OK);
    assert_non_null(memmem(blk, len, f.i32, sizeof f.i32)); /* stored verbatim */
    kvedge_put_item_t it;
    memset(&it, 0, sizeof it);
    uint32_t other[S_CHUNK];
    for (uint32_t i = 0; i < S_CHUNK; i++)
        other[i] = 7 + i;
    assert_int_equal(kvedge_chunk_id(NULL, 0, s_fx.model.id, NULL, other, S_CHUNK, &it.chunk.id),
                     KVEDGE_OK);
    snprintf(it.chunk.model_id, sizeof it.chunk.model_id, "%s", s_fx.model.id);
    it.chunk.tokens = S_CHUNK;
    it.block = blk;
    it.len = len;
    kvedge_client_t *c = s_client(ep, 3000);
    int rc = kvedge_client_put(c, &it, 1, NULL);
    kvedge_client_destroy(&c);
    free(blk);
    free(v);
    free(k);
    return rc;
}

/* Spies on both hops of a kvedge-mode decode (edge -> proxy, proxy -> cloud): the FETCH and
 * the cloud's streams were seen, and no frame the edge or the proxy sent holds the prompt as
 * int32 ids, uint16 ids or text. The same detector finds the prompt when a message does carry
 * it. */
static void test_prompt_never_leaves_edge(void **state)
{
    (void)state;
    s_env_t e;
    s_env_start(&e);
    s_node_t cloud;
    s_node_start(&cloud, &e, "cloud1", KVEDGE_ROLE_CLOUD, false);
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    s_prefill(cloud.ep, &q, NULL);

    s_spy_t cspy, espy;
    char ep[300];
    snprintf(ep, sizeof ep, "ipc://%s/cloud-spy.sock", e.root);
    s_spy_start(&cspy, ep, cloud.ep);
    char spec[400], pep[300];
    snprintf(spec, sizeof spec, "cloud cloud1 %s", cspy.ep);
    const char *specs[] = {spec};
    kvedge_proxy_t *p = s_proxy(&e, "proxy", specs, 1, 1, pep, sizeof pep);
    snprintf(ep, sizeof ep, "ipc://%s/edge-spy.sock", e.root);
    s_spy_start(&espy, ep, pep);

    kvedge_client_t *pc = s_client(espy.ep, S_DEADLINE);
    assert_int_equal(kvedge_client_node(pc)->role, KVEDGE_ROLE_PROXY); /* through the spy */
    kvedge_e2e_result_t *r = s_result();
    int32_t tok[S_NEW];
    int rc = s_e2e(KVEDGE_E2E_KVEDGE, pc, false, S_DEADLINE, NULL, tok, NULL, r);
    if (rc != KVEDGE_OK)
        fail_msg("decode through the spies: %s", kvedge_strerror(rc));
    s_check_layers(r, 0);
    assert_true(r->fetched >= 1); /* the proxy did go to the cloud */
    rc = s_e2e(KVEDGE_E2E_KVEDGE, pc, true, S_DEADLINE, NULL, tok, NULL,
               r); /* with time estimates */
    assert_int_equal(rc, KVEDGE_OK);
    assert_int_equal(r->prompt_bytes_sent, 0);
    kvedge_client_destroy(&pc);

    s_forms_t f;
    s_forms(&f);
    size_t eh[3], ch[3];
    s_leaks(&espy, &f, eh);
    s_leaks(&cspy, &f, ch);
    s_spy_counts_t ec, cc;
    s_spy_counts(&espy, &ec);
    s_spy_counts(&cspy, &cc);
    printf("  spies: edge->proxy %llu messages (%llu FETCH, %zu bytes), proxy->edge %llu; "
           "proxy->cloud %llu (%llu GET_LAYER), cloud->proxy %llu; frames holding the prompt: "
           "edge %zu/%zu/%zu, proxy %zu/%zu/%zu (int32/uint16/text)\n",
           (unsigned long long)ec.up_msgs, (unsigned long long)ec.ops[KVEDGE_OP_FETCH], ec.bytes,
           (unsigned long long)ec.down_msgs, (unsigned long long)cc.up_msgs,
           (unsigned long long)cc.ops[KVEDGE_OP_GET_LAYER], (unsigned long long)cc.down_msgs, eh[0],
           eh[1], eh[2], ch[0], ch[1], ch[2]);
    assert_false(ec.overflow);
    assert_false(cc.overflow);
    assert_true(ec.frames > 0 && ec.down_msgs > 0);
    assert_true(cc.frames > 0 && cc.down_msgs > 0);
    assert_int_equal(ec.ops[KVEDGE_OP_FETCH], 2);
    assert_true(cc.ops[KVEDGE_OP_GET_LAYER] >= 1);
    /* The capture holds the real requests: the FETCH carries the context's chunk ids. */
    assert_true(s_spy_contains(&espy, s_fx.ids[0].bytes, sizeof s_fx.ids[0].bytes) >= 1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(eh[i], 0);
        assert_int_equal(ch[i], 0);
    }

    /* Positive control on both hops: the proxy refuses a PUT, but its bytes crossed the spy;
     * the cloud stores it. */
    (void)s_put_prompt_bytes(espy.ep);
    assert_int_equal(s_put_prompt_bytes(cspy.ep), KVEDGE_OK);
    s_leaks(&espy, &f, eh);
    s_leaks(&cspy, &f, ch);
    printf("  positive control: frames holding the prompt: edge %zu/%zu/%zu, cloud %zu/%zu/%zu\n",
           eh[0], eh[1], eh[2], ch[0], ch[1], ch[2]);
    for (int i = 0; i < 3; i++) {
        assert_true(eh[i] >= 1);
        assert_true(ch[i] >= 1);
    }

    free(r);
    s_spy_stop(&espy);
    kvedge_proxy_destroy(&p);
    s_spy_stop(&cspy);
    s_node_stop(&cloud);
    s_env_stop(&e);
}

/* ---------------------------------------------------------------- 6. bad input */

static void test_bad_input(void **state)
{
    (void)state;
    const kvedge_decoder_config_t *c = s_fx.c;
    kvedge_e2e_result_t *r = s_result();
    int32_t tok[64];

    /* Names, defaults, the model record, the tokenizer, the chunk chain. */
    assert_string_equal(kvedge_e2e_mode_name(KVEDGE_E2E_KVEDGE), "kvedge");
    assert_string_equal(kvedge_e2e_mode_name(KVEDGE_E2E_LOCAL), "edge-only");
    assert_string_equal(kvedge_e2e_mode_name(KVEDGE_E2E_CLOUD_ONLY), "cloud-only");
    assert_string_equal(kvedge_e2e_mode_name((kvedge_e2e_mode_t)9), "?");
    kvedge_e2e_quant_t q;
    kvedge_e2e_quant_default(&q);
    assert_int_equal(q.scheme, KVEDGE_SCHEME_INT8);
    assert_int_equal(q.dtype, KVEDGE_DTYPE_FP16);
    assert_true(q.compress);
    assert_false(q.pin);
    assert_int_equal(s_fx.model.layers, c->layers);
    assert_int_equal(s_fx.model.kv_heads, c->heads);
    assert_int_equal(s_fx.model.head_dim, c->head_dim);
    assert_int_equal(s_fx.model.dtype, KVEDGE_DTYPE_FP16);
    assert_string_equal(s_fx.model.id, S_MODEL_ID);
    kvedge_model_t m;
    char long_id[KVEDGE_MODEL_ID_MAX_BYTES + 2];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    assert_int_equal(kvedge_e2e_model(s_fx.dec, "", &m), KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_model(s_fx.dec, long_id, &m), KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_model(s_fx.dec, NULL, &m), KVEDGE_EINVAL);
    kvedge_decoder_t *empty = kvedge_decoder_new();
    assert_int_equal(kvedge_e2e_model(empty, S_MODEL_ID, &m), KVEDGE_EINVAL);
    kvedge_decoder_destroy(&empty);
    size_t n;
    int32_t ids[8];
    /* The fixture's 256 ids cannot hold byte 255's id; OPT's 50272 can. */
    assert_int_equal(kvedge_e2e_byte_tokens("ab", 2, c->vocab, ids, 8, &n), KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_byte_tokens("abc", 3, 50272, ids, 2, &n), KVEDGE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 'a' + KVEDGE_E2E_BYTE_TOKEN_BASE);
    assert_int_equal(ids[1], 'b' + KVEDGE_E2E_BYTE_TOKEN_BASE);
    assert_int_equal(kvedge_e2e_byte_tokens(NULL, 3, 50272, ids, 8, &n), KVEDGE_EINVAL);
    kvedge_chunk_id_t chain[S_NCHUNK], want[S_NCHUNK];
    uint32_t u[S_CTX];
    for (uint32_t i = 0; i < S_CTX; i++)
        u[i] = (uint32_t)s_fx.ctx[i];
    assert_int_equal(kvedge_chunk_chain(NULL, 0, S_MODEL_ID, u, S_CTX, S_CHUNK, want, S_NCHUNK),
                     S_NCHUNK);
    assert_int_equal(kvedge_e2e_chunks(&s_fx.model, s_fx.ctx, S_CTX, S_CHUNK, chain, S_NCHUNK, &n),
                     KVEDGE_OK);
    assert_memory_equal(chain, want, sizeof want);
    assert_int_equal(kvedge_e2e_chunks(&s_fx.model, s_fx.ctx, S_CTX, S_CHUNK, chain, 2, &n),
                     KVEDGE_ENOSPACE);

    /* Decode: a valid edge-only request is the control; then each field missing. */
    kvedge_e2e_request_t ok = {.mode = KVEDGE_E2E_LOCAL,
                               .decoder = s_fx.dec,
                               .ctx = s_fx.ctx,
                               .ctx_len = S_CTX,
                               .prompt = s_fx.prompt,
                               .prompt_len = S_PROMPT,
                               .max_new = S_NEW};
    assert_int_equal(kvedge_e2e_decode(&ok, tok, r), KVEDGE_OK);
    assert_memory_equal(tok, s_fx.ref_tok, S_NEW * sizeof(int32_t));
    kvedge_e2e_request_t b = ok;
    b.decoder = NULL;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    b = ok;
    b.ctx = NULL;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    b = ok;
    b.ctx_len = 0;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    b = ok;
    b.prompt = NULL;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    b = ok;
    b.prompt_len = 0;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    b = ok;
    b.max_new = 0;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    b = ok;
    b.mode = (kvedge_e2e_mode_t)9;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_decode(NULL, tok, r), KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_decode(&ok, NULL, r), KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_decode(&ok, tok, NULL), KVEDGE_EINVAL);
    int32_t bad_prompt[S_PROMPT];
    memcpy(bad_prompt, s_fx.prompt, sizeof bad_prompt);
    bad_prompt[3] = (int32_t)c->vocab;
    b = ok;
    b.prompt = bad_prompt;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    b = ok;
    b.mode = KVEDGE_E2E_CLOUD_ONLY; /* no cloud */
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);

    /* Positions: ctx + prompt + max_new may reach max_positions, not pass it. */
    const uint32_t room = c->max_positions - S_CTX - S_PROMPT;
    assert_true(room >= 1 && room <= 64);
    b = ok;
    b.max_new = room + 1;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_ETOOBIG);
    b.max_new = room;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_OK);
    assert_int_equal(r->generated, room);

    /* Kvedge mode without its proxy or model; over positions. A store node stands in for a
     * proxy (GET_LAYER); nothing is fetched for a refused request. */
    s_env_t e;
    s_env_start(&e);
    s_node_t node;
    s_node_start(&node, &e, "cloud1", KVEDGE_ROLE_CLOUD, false);
    kvedge_client_t *nc = s_client(node.ep, 3000);
    kvedge_e2e_request_t kv = ok;
    kv.mode = KVEDGE_E2E_KVEDGE;
    kv.proxy = nc;
    kv.model = &s_fx.model;
    kv.chunk_tokens = S_CHUNK;
    kv.deadline_ms = 3000;
    b = kv;
    b.proxy = NULL;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    b = kv;
    b.model = NULL;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_EINVAL);
    b = kv;
    b.max_new = room + 1;
    assert_int_equal(kvedge_e2e_decode(&b, tok, r), KVEDGE_ETOOBIG);

    /* Prefill: a model record that is not the decoder's, or no room for the chain: refused
     * before anything is put. */
    kvedge_chunk_id_t out[S_NCHUNK];
    kvedge_model_t wrong[4];
    for (int i = 0; i < 4; i++)
        wrong[i] = s_fx.model;
    wrong[0].layers++;
    wrong[1].kv_heads++;
    wrong[2].head_dim *= 2;
    wrong[3].layers--;
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvedge_e2e_prefill(nc, s_fx.dec, &wrong[i], s_fx.ctx, S_CTX, S_CHUNK, &q,
                                            out, S_NCHUNK, NULL),
                         KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_prefill(nc, s_fx.dec, &s_fx.model, s_fx.ctx, S_CTX, S_CHUNK, &q,
                                        out, S_NCHUNK - 1, NULL),
                     KVEDGE_ENOSPACE);
    assert_int_equal(kvedge_e2e_prefill(NULL, s_fx.dec, &s_fx.model, s_fx.ctx, S_CTX, S_CHUNK, &q,
                                        out, S_NCHUNK, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_prefill(nc, NULL, &s_fx.model, s_fx.ctx, S_CTX, S_CHUNK, &q, out,
                                        S_NCHUNK, NULL),
                     KVEDGE_EINVAL);
    assert_int_equal(kvedge_e2e_prefill(nc, s_fx.dec, &s_fx.model, s_fx.ctx, 0, S_CHUNK, &q, out,
                                        S_NCHUNK, NULL),
                     KVEDGE_EINVAL);
    kvedge_chunk_entry_t *list = NULL;
    size_t nlist = 99;
    assert_int_equal(kvedge_client_list_all(nc, &list, &nlist), KVEDGE_OK);
    assert_int_equal(nlist, 0);
    free(list);

    /* The cloud-only service: bad link spec, no decoder. */
    kvedge_e2e_cloud_t *cm = NULL;
    assert_int_equal(kvedge_e2e_cloud_new(s_fx.dec, s_fx.ctx, S_CTX, "fast", &cm), KVEDGE_EINVAL);
    assert_null(cm);
    assert_int_equal(kvedge_e2e_cloud_new(NULL, s_fx.ctx, S_CTX, NULL, &cm), KVEDGE_EINVAL);
    kvedge_e2e_cloud_destroy(NULL);

    kvedge_client_destroy(&nc);
    s_node_stop(&node);
    s_env_stop(&e);
    free(r);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_lossless_matches_local),
        cmocka_unit_test(test_quantized_within_bounds),
        cmocka_unit_test(test_precision_accept),
        cmocka_unit_test(test_sources_identical),
        cmocka_unit_test(test_yields_cores_to_a_slow_fetch),
        cmocka_unit_test(test_prefill_kv_same_blocks),
        cmocka_unit_test(test_miss_recomputed),
        cmocka_unit_test(test_in_place_matches_copying),
        cmocka_unit_test(test_prompt_never_leaves_edge),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
