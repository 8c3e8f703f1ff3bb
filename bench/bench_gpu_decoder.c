/* The GPU decoder's time to first token, fp16: recomputing a context plus a 16-token prompt on the
 * GPU (the recomputation baseline) against decoding the prompt over context K/V that is already
 * on the device (kvedge's lower bound when every layer is fetched). OPT-1.3B's shape with
 * random weights at contexts of 1024 and 2048, and the trained models/kjv models at contexts
 * that fit their 512 positions. Each figure is the median of KVEDGE_BENCH_REPS_MIN synchronous
 * calls after warm-up, timed on the host clock: a call returns with the logits on the host, so
 * this is the TTFT a caller sees. Usage: bench_gpu_decoder [MODELS_DIR]. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_common.h"
#include "clients/decoder/decoder.h"
#include "clients/decoder/decoder_gpu.h"
#include "gpu/gpu.h"
#include "gpu/opt.h"
#include "gpu/stage.h"
#include "access/codec/error.h"
#include "access/codec/synth.h"

#ifdef KVEDGE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define S_PROMPT_TOKENS 16
#define S_WARMUP        2

/* Host weights of a shape, random (uniform with OPT's std of 0.02), one set of layer tensors
 * shared by every layer: the costs are those of the real model, the host memory one layer's. */
typedef struct {
    kvedge_gpu_opt_weights_t w;
    float *embed, *pos, *ones, *zeros, *attn, *fc1, *fc2;
    kvedge_gpu_opt_layer_t *layer;
} s_random_t;

static float *s_fill(kvedge_rng_t *r, size_t n)
{
    float *f = bench_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) /* uniform on [-a, a], a = 0.02 * sqrt(3): std 0.02 */
        f[i] = (float)(((double)(kvedge_rng_next(r) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * 0.0346);
    return f;
}

static void s_random_make(s_random_t *m, const kvedge_decoder_config_t *c)
{
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 1234);
    const size_t H = c->hidden, F = c->ffn, big = F > H ? F : H;
    m->embed = s_fill(&r, (size_t)c->vocab * H);
    m->pos = s_fill(&r, ((size_t)c->max_positions + KVEDGE_GPU_OPT_POSITION_OFFSET) * H);
    m->attn = s_fill(&r, H * H);
    m->fc1 = s_fill(&r, F * H);
    m->fc2 = s_fill(&r, H * F);
    m->ones = bench_alloc(big * sizeof(float));
    m->zeros = bench_alloc(big * sizeof(float));
    for (size_t i = 0; i < big; i++) {
        m->ones[i] = 1.0f;
        m->zeros[i] = 0.0f;
    }
    m->layer = bench_alloc(c->layers * sizeof *m->layer);
    for (uint32_t l = 0; l < c->layers; l++)
        m->layer[l] = (kvedge_gpu_opt_layer_t){
            .ln1_w = m->ones,
            .ln1_b = m->zeros,
            .wq = m->attn,
            .bq = m->zeros,
            .wk = m->attn,
            .bk = m->zeros,
            .wv = m->attn,
            .bv = m->zeros,
            .wo = m->attn,
            .bo = m->zeros,
            .ln2_w = m->ones,
            .ln2_b = m->zeros,
            .fc1_w = m->fc1,
            .fc1_b = m->zeros,
            .fc2_w = m->fc2,
            .fc2_b = m->zeros,
        };
    m->w = (kvedge_gpu_opt_weights_t){
        .cfg = {c->layers, c->heads, c->head_dim, c->hidden, c->ffn, c->vocab, c->max_positions},
        .embed_tokens = m->embed,
        .embed_positions = m->pos,
        .final_ln_w = m->ones,
        .final_ln_b = m->zeros,
        .lm_head = m->embed,
        .layer = m->layer,
    };
}

static void s_random_free(s_random_t *m)
{
    free(m->layer);
    free(m->zeros);
    free(m->ones);
    free(m->fc2);
    free(m->fc1);
    free(m->attn);
    free(m->pos);
    free(m->embed);
}

/* Hands out the device K/V of every layer. */
typedef struct {
    void **k, **v;
} s_prov_t;

static int s_prov(void *arg, uint32_t layer, const void **k, const void **v)
{
    const s_prov_t *p = arg;
    *k = p->k[layer];
    *v = p->v[layer];
    return 0;
}

/* One row of the table: prefill of ctx + prompt against decode over ctx's device K/V. */
static void s_row(const char *name, kvedge_gpu_opt_t *g, uint32_t ctx)
{
    const kvedge_gpu_opt_config_t *c = kvedge_gpu_opt_config(g);
    const uint32_t n = ctx + S_PROMPT_TOKENS;
    kvedge_rng_t r;
    kvedge_rng_seed(&r, 99 + ctx);
    int32_t *t = bench_alloc(n * sizeof(int32_t));
    for (uint32_t i = 0; i < n; i++)
        t[i] = (int32_t)(kvedge_rng_next(&r) % c->vocab);
    float *logits = bench_alloc(c->vocab * sizeof(float));
    double pre[KVEDGE_BENCH_REPS_MIN], dec[KVEDGE_BENCH_REPS_MIN];

    for (int i = -S_WARMUP; i < KVEDGE_BENCH_REPS_MIN; i++) {
        const double t0 = bench_now_s();
        KVEDGE_BENCH_CHECK(kvedge_gpu_opt_prefill(g, t, n, logits, NULL, NULL));
        if (i >= 0)
            pre[i] = bench_now_s() - t0;
    }

    /* The context's K/V on the device, as the cloud side would have produced it. */
    const size_t kv_bytes = (size_t)c->heads * ctx * c->head_dim * 2; /* fp16 */
    void **dk = bench_alloc(c->layers * sizeof(void *)),
         **dv = bench_alloc(c->layers * sizeof(void *));
    for (uint32_t l = 0; l < c->layers; l++) {
        KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(kv_bytes, &dk[l]));
        KVEDGE_BENCH_CHECK(kvedge_gpu_dev_alloc(kv_bytes, &dv[l]));
    }
    KVEDGE_BENCH_CHECK(kvedge_gpu_opt_prefill(g, t, ctx, NULL, dk, dv));
    kvedge_gpu_opt_session_t *s = NULL;
    KVEDGE_BENCH_CHECK(kvedge_gpu_opt_session_new(g, &s));
    s_prov_t p = {dk, dv};
    const kvedge_gpu_opt_ctx_t cx = {t, ctx, ctx, s_prov, &p};
    for (int i = -S_WARMUP; i < KVEDGE_BENCH_REPS_MIN; i++) {
        const double t0 = bench_now_s();
        KVEDGE_BENCH_CHECK(
            kvedge_gpu_opt_session_begin(s, &cx, t + ctx, S_PROMPT_TOKENS, 0, logits));
        if (i >= 0)
            dec[i] = bench_now_s() - t0;
    }
    const double mp = bench_median(pre, KVEDGE_BENCH_REPS_MIN) * 1e3;
    const double md = bench_median(dec, KVEDGE_BENCH_REPS_MIN) * 1e3;
    printf("| %s | %u | %u | %.2f | %.2f | %.1fx |\n", name, ctx, S_PROMPT_TOKENS, mp, md, mp / md);
    fflush(stdout);
    kvedge_gpu_opt_session_destroy(&s);
    for (uint32_t l = 0; l < c->layers; l++) {
        kvedge_gpu_dev_free(dk[l]);
        kvedge_gpu_dev_free(dv[l]);
    }
    free(dk);
    free(dv);
    free(logits);
    free(t);
}

int main(int argc, char **argv)
{
    if (kvedge_gpu_device_count() == 0) {
        printf("skipped: no device\n");
        return 0;
    }
    const char *models = argc > 1 ? argv[1] : KVEDGE_MODELS;
    const char *dev = "unknown device";
#ifdef KVEDGE_HAVE_CUDA
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        dev = prop.name;
#endif
    printf("GPU decoder TTFT, fp16, %s: median of %d (after %d warm-up), host clock around "
           "synchronous calls\n\n",
           dev, KVEDGE_BENCH_REPS_MIN, S_WARMUP);
    printf("| model | context | prompt | GPU prefill ctx+prompt (ms) | decode over device K/V "
           "(ms) | ratio |\n| --- | --- | --- | --- | --- | --- |\n");

    kvedge_decoder_config_t c;
    KVEDGE_BENCH_CHECK(kvedge_decoder_shape("opt-1.3b", &c));
    /* 16 more position rows than OPT-1.3B's 2048, so that a 2048-token context takes a prompt;
     * the cost is that of the real model. */
    c.max_positions = 2048 + S_PROMPT_TOKENS;
    s_random_t m;
    s_random_make(&m, &c);
    kvedge_gpu_opt_t *g = NULL;
    KVEDGE_BENCH_CHECK(kvedge_gpu_opt_new(&m.w, KVEDGE_DTYPE_FP16, &g));
    s_random_free(&m);
    s_row("opt-1.3b (random)", g, 1024);
    s_row("opt-1.3b (random)", g, 2048);
    kvedge_gpu_opt_destroy(&g);

    static const char *const kjv[2] = {"edge", "cloud"};
    for (int i = 0; i < 2; i++) {
        char path[1024], name[64];
        snprintf(path, sizeof path, "%s/kjv/%s/model.safetensors", models, kjv[i]);
        kvedge_decoder_t *md = kvedge_decoder_new();
        if (!md || kvedge_decoder_load(md, path, 0) != KVEDGE_OK) {
            printf("| kjv %s | not loaded: %s |\n", kjv[i], md ? kvedge_decoder_error(md) : "");
            kvedge_decoder_destroy(&md);
            continue;
        }
        kvedge_gpu_opt_weights_t w;
        KVEDGE_BENCH_CHECK(kvedge_decoder_gpu_weights(md, &w));
        KVEDGE_BENCH_CHECK(kvedge_gpu_opt_new(&w, KVEDGE_DTYPE_FP16, &g));
        kvedge_decoder_gpu_weights_free(&w);
        snprintf(name, sizeof name, "kjv %s", kjv[i]);
        const uint32_t maxp = kvedge_gpu_opt_config(g)->max_positions;
        s_row(name, g, maxp / 2);
        s_row(name, g, maxp - S_PROMPT_TOKENS);
        kvedge_gpu_opt_destroy(&g);
        kvedge_decoder_destroy(&md);
    }
    printf("\nopt-1.3b: random weights, 2064 position rows (2048 context + 16 prompt); the kjv "
           "models have 512 positions.\n");
    return 0;
}
